package variants_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/provider"
)

// readyProvider reads the provider's URL from GET /ready, as any local
// process can, and returns it with the whole answer.
func readyProvider(t *testing.T, a *app.App) (string, string) {
	t.Helper()
	r := labtest.Do(t, http.MethodGet, a.URL()+"/ready", nil, "")
	ready := labtest.Decode[struct {
		Dependencies map[string]struct{ Describe string } `json:"dependencies"`
	}](t, r)
	m := regexp.MustCompile(`http://\S+`).FindString(ready.Dependencies["provider"].Describe)
	if m == "" {
		t.Fatalf("GET /ready names no provider URL: %s", r.Body)
	}
	return m, string(r.Body)
}

// chargeRun charges acme's acct-1 cents on the memory store under key, as
// part of run.
func chargeRun(t *testing.T, a *app.App, run, key string, cents int64) lab.Charge {
	t.Helper()
	h := http.Header{"Authorization": {"Bearer " + labtest.Acme}, "Content-Type": {"application/json"},
		"Idempotency-Key": {key}, "Lab-Run": {run}}
	r := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=memory", h, fmt.Sprintf(`{"account":"acct-1","amount_cents":%d}`, cents))
	if r.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", r.Status, r.Body)
	}
	return labtest.Decode[lab.Charge](t, r)
}

// TestProviderAPIClosed replays finding 2's first attack: a local process
// reads the lab's own provider from GET /ready and calls its API — posts a
// 1-cent capture for a 1,000,000-cent charge, reads every namespace's
// captures, sets another namespace's faults, deletes the records. Without
// the lab's API key each call is a 401 that changes nothing, /ready never
// shows the key, and the charge is captured once, by the relay, for its
// amount, and paid.
func TestProviderAPIClosed(t *testing.T) {
	t.Parallel()
	const key = "provider-key-of-this-lab"
	a := labtest.Start(t, labConfig(func(c *app.Config) { c.ProviderAPIKey = key }))
	ctx := t.Context()
	base, ready := readyProvider(t, a)
	if strings.Contains(ready, key) {
		t.Fatalf("GET /ready shows the provider's API key: %s", ready)
	}
	charge := chargeRun(t, a, "run-open-provider", "k-open-provider", 1_000_000)
	capture := `{"charge_id":"` + charge.ID + `","tenant":"acme","amount_cents":1,"currency":"USD","via":"outbox"}`
	for _, c := range []struct {
		method, path, body string
		header             http.Header
	}{
		{http.MethodPost, "/provider/captures", capture, http.Header{"Content-Type": {"application/json"}, provider.KeyHeader: {"attacker"}}},
		{http.MethodPost, "/provider/captures", capture, http.Header{"Content-Type": {"application/json"}, provider.KeyHeader: {"attacker-2"},
			provider.FaultHeader: {"decline"}, "Authorization": {"Bearer " + labtest.Acme}}},
		{http.MethodGet, "/provider/captures", "", nil},
		{http.MethodGet, "/provider/stats?namespace=globex", "", nil},
		{http.MethodPut, "/provider/faults/globex", `{"down":true}`, http.Header{"Content-Type": {"application/json"}}},
		{http.MethodDelete, "/provider/records", "", nil},
		{http.MethodDelete, "/provider/namespaces/acme", "", http.Header{"Authorization": {"Bearer wrong"}}},
	} {
		got := labtest.Do(t, c.method, base+c.path, c.header, c.body)
		if got.Status != http.StatusUnauthorized || labtest.Decode[lab.Problem](t, got).Code != "unauthenticated" {
			t.Errorf("%s %s without the API key: %d %s, want 401 unauthenticated", c.method, c.path, got.Status, got.Body)
		}
	}
	if f, err := a.Provider().Faults(ctx, "globex"); err != nil || f != (provider.Faults{}) {
		t.Fatalf("globex's faults %+v (%v): set without the key", f, err)
	}
	rec := settle(t, a, "run-open-provider")
	if rec.Agree != 1 || rec.Disagree != 0 {
		t.Fatalf("reconciliation %+v: want the charge captured once and paid", rec)
	}
	caps, err := a.Provider().Captures(ctx, provider.Filter{ChargeID: charge.ID})
	if err != nil || len(caps) != 1 || caps[0].AmountCents != 1_000_000 || caps[0].Key != lab.DerivedCaptureKey(charge.ID) {
		t.Fatalf("captures of %s: %+v (%v); want one, the relay's, for 1,000,000 cents", charge.ID, caps, err)
	}
}
