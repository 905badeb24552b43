package redis

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// TestRecordRoundTrip: a completed key's value gives back the fingerprint,
// status, time and the body byte for byte, '|' and all; a record packed by
// an earlier version reads the same.
func TestRecordRoundTrip(t *testing.T) {
	at := time.UnixMilli(1_790_000_000_123).UTC()
	want := record{Fingerprint: "f1ee", Status: 201, CreatedAt: at, Body: []byte(`{"id":"ch_1","note":"a|b||c"}` + "\n")}
	for name, v := range map[string]string{
		"value": want.value(), "json": mustJSON(t, want), "packed": `done|f1ee|201|1790000000123|{"id":"ch_1","note":"a|b||c"}` + "\n",
	} {
		d, err := decode(v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d.state != lab.KeyCompleted || d.fingerprint != want.Fingerprint || d.rec.Status != 201 || !d.rec.CreatedAt.Equal(at) || string(d.rec.Body) != string(want.Body) {
			t.Errorf("%s: decoded %+v, want %+v", name, d, want)
		}
	}
	for _, bad := range []string{"done|", "done|fp|2x1|1|{}", "done|fp|201|soon|{}", "{not json"} {
		if _, err := decode(bad); err == nil {
			t.Errorf("decode(%q) accepted it", bad)
		}
	}
}

func mustJSON(t *testing.T, r record) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
