package wire_test

import (
	"errors"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
)

// TestDecode holds the struct reader, which the payment provider's routes
// use, to the charge body's strictness, unknown members refused besides.
func TestDecode(t *testing.T) {
	type capture struct {
		ChargeID    string `json:"charge_id"`
		AmountCents int64  `json:"amount_cents"`
	}
	var got capture
	if err := wire.Decode([]byte(` {"charge_id":"ch_1","amount_cents":100} `+"\n"), &got); err != nil || got != (capture{"ch_1", 100}) {
		t.Fatalf("got %+v, %v", got, err)
	}
	for _, tc := range []struct{ name, body, param string }{
		{"UnknownField", `{"charge_id":"ch_1","memo":"x"}`, "body"},
		{"Duplicate", `{"charge_id":"ch_1","charge_id":"ch_2"}`, "charge_id"},
		{"TrailingObject", `{"charge_id":"ch_1"}{}`, "body"},
		{"TrailingGarbage", `{"charge_id":"ch_1"} x`, "body"},
		{"Empty", ``, "body"},
		{"NotAnObject", `[1]`, "body"},
		{"Null", `null`, "body"},
		{"InvalidUTF8", "{\"charge_id\":\"\xff\"}", "body"},
		{"LoneSurrogate", `{"charge_id":"\ud800"}`, "body"},
		{"WrongType", `{"amount_cents":"100"}`, "body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v capture
			err := wire.Decode([]byte(tc.body), &v)
			var ie *lab.InvalidError
			if !errors.As(err, &ie) || ie.Param != tc.param {
				t.Fatalf("%q: %v; want an *InvalidError naming %s", tc.body, err, tc.param)
			}
		})
	}
}
