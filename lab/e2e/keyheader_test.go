package e2e_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
)

// TestIdempotencyKeyHeader: the quoted form of the draft and the bare form
// clients send name one key, the key is echoed back, and two fields are
// refused with nothing charged.
func TestIdempotencyKeyHeader(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	send := func(lines ...string) labtest.Reply {
		h := http.Header{"Authorization": {"Bearer " + labtest.Acme}, "Content-Type": {"application/json"}}
		for _, l := range lines {
			h.Add(lab.KeyHeader, l)
		}
		return labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=memory", h, e2e.Body2500)
	}
	first := send(`"sf-1"`)
	if first.Status != http.StatusCreated || first.Header.Get(lab.KeyHeader) != `"sf-1"` {
		t.Fatalf("quoted: %d, echoed %q", first.Status, first.Header.Get(lab.KeyHeader))
	}
	again := send("sf-1")
	if again.Header.Get("Idempotent-Replayed") != "true" || string(again.Body) != string(first.Body) {
		t.Fatalf("bare form of the same key: %d, replayed %q", again.Status, again.Header.Get("Idempotent-Replayed"))
	}
	two := send("sf-2", "sf-3")
	if p := labtest.Decode[lab.Problem](t, two); two.Status != http.StatusBadRequest || p.Param != lab.KeyHeader {
		t.Fatalf("two fields: %d %s", two.Status, two.Body)
	}
	if n := e2e.KeyCharges(t, a, "acme", memory.Name, "sf-1"); n != 1 {
		t.Fatalf("sf-1 charged %d times, want 1", n)
	}
	for _, k := range []string{"sf-2", "sf-3", "sf-2, sf-3"} {
		if n := e2e.KeyCharges(t, a, "acme", memory.Name, k); n != 0 {
			t.Fatalf("the refused request charged %q", k)
		}
	}
}

// TestLabHeadersSentOnce: Lab-Run, Lab-Fault and Lab-Step, sent twice, are
// refused with 400 naming the header, as a repeated Idempotency-Key is,
// and nothing is charged: the lab would otherwise honour the first.
func TestLabHeadersSentOnce(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	for _, name := range []string{"Lab-Run", lab.FaultHeader, "Lab-Step"} {
		t.Run(name, func(t *testing.T) {
			key := "k-once-" + name
			h := http.Header{"Authorization": {"Bearer " + labtest.Acme}, "Content-Type": {"application/json"},
				lab.KeyHeader: {key}, name: {"slow", "slow"}}
			r := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=memory", h, e2e.Body2500)
			if p := labtest.Decode[lab.Problem](t, r); r.Status != http.StatusBadRequest || p.Param != name || !strings.Contains(p.Detail, "sent once") {
				t.Fatalf("%s twice: %d %s", name, r.Status, r.Body)
			}
			if n := e2e.KeyCharges(t, a, "acme", memory.Name, key); n != 0 {
				t.Fatalf("the refused request charged %d times", n)
			}
		})
	}
}
