package wire_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
)

func TestParseJoinRequest(t *testing.T) {
	for body, want := range map[string]string{"": "", "  ": "", `{"code":"retry-safely"}`: "retry-safely", ` {"code": "x"} `: "x", `{}`: ""} {
		if got, err := wire.ParseJoinRequest(strings.NewReader(body)); err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", body, got, err, want)
		}
	}
	for _, body := range []string{`{"code":"x"}]`, `{"code":"x"} x`, `{"code":"x"}{"code":"y"}`, `{"code":"x","code":"y"}`,
		`{"code":null}`, `{"code":7}`, `{"code":""}`, `{"other":"x"}`, "{\"code\":\"\xff\"}", `[]`, `"x"`} {
		_, err := wire.ParseJoinRequest(strings.NewReader(body))
		var ie *lab.InvalidError
		if !errors.As(err, &ie) {
			t.Errorf("%q: accepted (%v)", body, err)
		}
	}
}
