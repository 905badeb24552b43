package app_test

import (
	"net/http"
	"slices"
	"testing"

	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants/memory"
)

// TestReplicasStartOnDemand: a run's replicas are started when a run first
// needs them, each its own server with its own memory store, and a reset
// asked of the primary reaches them: a key charged on the third replica is
// forgotten there too.
func TestReplicasStartOnDemand(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = []variant.Variant{memory.Variant()}
	cfg.Addr, cfg.EmbedPostgres, cfg.EmbedRedis, cfg.RedisPair = "127.0.0.1:0", false, false, false
	a := labtest.Start(t, cfg)
	urls, err := a.Targets(t.Context(), 3)
	if err != nil || len(urls) != 3 || urls[0] != a.URL() {
		t.Fatalf("three targets: %v %v", urls, err)
	}
	var names []string
	for _, u := range urls {
		r := labtest.Do(t, http.MethodGet, u+"/health", nil, "")
		names = append(names, r.Header.Get("Lab-Replica"))
	}
	if !slices.Equal(names, []string{"r1", "r2", "r3"}) {
		t.Fatalf("the replicas answer as %v", names)
	}
	if again, err := a.Targets(t.Context(), 3); err != nil || !slices.Equal(again, urls) {
		t.Fatalf("asked again, the set grew or moved: %v %v", again, err)
	}
	charge := func() labtest.Reply {
		return labtest.Do(t, http.MethodPost, urls[2]+"/charges?store=memory", labtest.ChargeHeader(labtest.Acme, "on-r3", nil),
			`{"account":"acct-1","amount_cents":100,"currency":"USD"}`)
	}
	if r := charge(); r.Status != http.StatusCreated {
		t.Fatalf("charge on r3: %d %s", r.Status, r.Body)
	}
	if r := charge(); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry on r3 was not replayed: %d", r.Status)
	}
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/reset-lab", labtest.Bearer(labtest.Acme), ""); r.Status != http.StatusOK {
		t.Fatalf("reset: %d %s", r.Status, r.Body)
	}
	if r := charge(); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after the reset, r3 still knew the key: %d %q", r.Status, r.Header.Get("Idempotent-Replayed"))
	}
}
