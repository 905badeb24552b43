package e2e_test

import (
	"net/http"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/rediscache"
)

// TestCacheLossCostsOnlySpeed: on redis+postgres a store restart wipes the
// Redis cache; the retries still replay, read from PostgreSQL, and the
// next run's replays come from Redis again. The run reports each path's
// replay latency.
func TestCacheLossCostsOnlySpeed(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.FullConfig(t))
	run := func(query string) experiment.Report {
		t.Helper()
		// store=redis+postgres as typed in a shell: the '+' arrives as a space.
		r := labtest.Do(t, http.MethodGet, a.URL()+"/charge-idempotent?store=redis+postgres&key=k-cache&"+query, nil, "")
		if r.Status != http.StatusOK {
			t.Fatalf("run: %d %s", r.Status, r.Body)
		}
		return labtest.Decode[experiment.Report](t, r)
	}
	rep := run("fault=store_restart&attempts=4")
	if rep.Store != rediscache.Name || rep.Verdict != lab.Holds || rep.KeyCharges != 1 {
		t.Fatalf("store_restart: %s %s, %d charges: %s", rep.Store, rep.Verdict, rep.KeyCharges, rep.Explanation)
	}
	if _, ok := rep.LookupOverheadByPath[rediscache.FromPostgres]; !ok || rep.IdempotencyHits != 3 {
		t.Fatalf("after the cache was lost the replays came from %v (%d hits); want PostgreSQL", rep.LookupOverheadByPath, rep.IdempotencyHits)
	}
	// The retries race: the first to miss refills the cache, so the others
	// may already read Redis; every one replays.
	for _, res := range rep.Timeline[1:] {
		if f := res.Final(); !f.Replayed || (f.From != rediscache.FromPostgres && f.From != rediscache.FromRedis) {
			t.Fatalf("a retry after the restart: %+v; want a replay, read from PostgreSQL or the refilled cache", f)
		}
	}
	again := run("attempts=3")
	if again.KeyCharges != 1 || again.IdempotencyHits != 3 {
		t.Fatalf("the next run: %d charges, %d hits", again.KeyCharges, again.IdempotencyHits)
	}
	if _, ok := again.LookupOverheadByPath[rediscache.FromRedis]; !ok {
		t.Fatalf("the next run's replays came from %v; want Redis, refilled", again.LookupOverheadByPath)
	}
	t.Logf("replay latency by path: after the restart %v, then %v", rep.LookupOverheadByPath, again.LookupOverheadByPath)
}
