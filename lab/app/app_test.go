package app_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/provider"
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

// TestBeyondLoopbackAdminToken: listening beyond loopback with none given,
// a lab draws its admin token (and says it drew it), while a replica of a
// cluster refuses to start, since its peers would draw others; on loopback
// none is drawn.
func TestBeyondLoopbackAdminToken(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = []variant.Variant{memory.Variant()}
	cfg.EmbedPostgres, cfg.EmbedRedis, cfg.RedisPair = false, false, false
	for addr, want := range map[string]bool{"127.0.0.1:0": false, "0.0.0.0:0": true} {
		cfg.Addr = addr
		token, drawn := labtest.Start(t, cfg).AdminToken()
		if drawn != want || (token != "") != want {
			t.Errorf("listening on %s: admin token %q, drawn %v; want drawn %v", addr, token, drawn, want)
		}
	}
	url, schema := labtest.Postgres(t) // a cluster needs a shared ledger
	cfg.Addr, cfg.Peers, cfg.DatabaseURL, cfg.PGSchema = "0.0.0.0:0", []string{"http://127.0.0.1:1"}, url, schema
	if a, err := app.Start(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "same -admin-token") {
		if a != nil {
			_ = a.Close(t.Context())
		}
		t.Fatalf("a cluster replica beyond loopback without a token started (%v)", err)
	}
}

// TestProviderReadsWaitForTheirCaller: -provider-timeout bounds a delivery
// (a withheld answer shows as it), never the lab's own reads of its
// provider: with a timeout no call can meet, the reads still answer.
func TestProviderReadsWaitForTheirCaller(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = []variant.Variant{memory.Variant()}
	cfg.Addr, cfg.EmbedPostgres, cfg.EmbedRedis, cfg.RedisPair = "127.0.0.1:0", false, false, false
	cfg.ProviderTimeout = time.Nanosecond
	a := labtest.Start(t, cfg)
	if _, err := a.Provider().Stats(t.Context(), provider.Filter{}); err != nil {
		t.Fatalf("the provider's stats with a 1 ns delivery timeout: %v", err)
	}
	if r := labtest.Do(t, http.MethodGet, a.URL()+"/outbox", nil, ""); r.Status != http.StatusOK {
		t.Fatalf("GET /outbox, which reads the provider: %d %s", r.Status, r.Body)
	}
}
