package effects_test

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/cost"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
)

// readCost parses what the lab's /metrics counts of its dependencies.
func readCost(t *testing.T, base string) cost.Counts {
	t.Helper()
	r := labtest.Do(t, http.MethodGet, base+"/metrics", nil, "")
	c, err := cost.Parse(strings.NewReader(string(r.Body)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTheCostOfEachPathCounted reads the drivers' counts around a batch of
// each path (fresh charges and replays per store, with the relay held;
// then the settled effects of them all) and holds them to what each
// design takes: the count is the lesson, so a change that adds a commit, a
// round trip or a request fails here.
func TestTheCostOfEachPathCounted(t *testing.T) {
	t.Parallel()
	rurl, prefix := labtest.Redis(t)
	a := labtest.Start(t, e2e.EffectsConfig(t, func(c *app.Config) {
		c.RedisURL, c.RedisPrefix = rurl, prefix
		c.ProviderTimeout = 10 * time.Second // a capture slowed by a loaded machine is not retried: one call each
		c.PruneInterval = time.Hour          // the pruner's commits are no path's: none while counting
		// A batch whose last deliveries wait past the claim's lease on a
		// loaded machine is claimed and delivered again (at least once, as
		// designed): a longer lease keeps the count to the path's own.
		c.Relay.Lease = time.Minute
	}))
	const n = 20
	// A charge's own cost: 1 durable commit, in the ledger's transaction
	// (with the key's, for postgres); redis adds its claim, the scope's key
	// list and the completion; a replay writes nothing.
	want := map[lab.StoreName]struct{ fresh, replay float64 }{memory.Name: {0, 0}, redis.Name: {3, 1}, postgres.Name: {0, 0}}
	a.HoldDelivery(true)
	var runs []string
	for _, store := range []lab.StoreName{memory.Name, redis.Name, postgres.Name} {
		run := "cost-" + string(store)
		e2e.OpenRun(t, a, run)
		runs = append(runs, run)
		before := readCost(t, a.URL())
		chargeMany(t, a.URL(), store, run, n, nil)
		fresh := readCost(t, a.URL()).Per(before, n)
		before = readCost(t, a.URL())
		h := http.Header{"Authorization": {"Bearer " + labtest.Acme}, "Content-Type": {"application/json"},
			"Idempotency-Key": {run + "-0"}, "Lab-Run": {run}}
		for range n {
			if r := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store="+string(store), h, e2e.Body2500); r.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("%s: a replay answered %d %s", store, r.Status, r.Body)
			}
		}
		replay := readCost(t, a.URL()).Per(before, n)
		t.Logf("%s: fresh %+v; replay %+v", store, fresh, replay)
		// Round trips per charge are rounded: a command that timed out on a
		// loaded machine and that go-redis sent again counts twice, once in
		// a while, where a round trip the path itself added counts once per
		// charge.
		if fresh.DurableCommits[cost.Lab] != 1 || len(fresh.AsyncCommits) != 0 || math.Round(fresh.RedisTrips) != want[store].fresh || len(fresh.HTTPOut) != 0 {
			t.Errorf("%s: a fresh charge cost %+v; want 1 durable commit, %v Redis round trips, no call to the provider", store, fresh, want[store].fresh)
		}
		if cost.Sum(replay.DurableCommits) != 0 || len(replay.AsyncCommits) != 0 || math.Round(replay.RedisTrips) != want[store].replay {
			t.Errorf("%s: a replay cost %+v; want no commit and %v Redis round trips", store, replay, want[store].replay)
		}
	}
	before := readCost(t, a.URL())
	a.HoldDelivery(false)
	for _, run := range runs {
		settle(t, a, run)
	}
	effect := readCost(t, a.URL()).Per(before, len(runs)*n)
	t.Logf("a settled effect: %+v", effect)
	// One call carries the capture and its receipt; the provider commits
	// both, with the webhooks it owes, in one statement; each of the two
	// webhooks is one request and one durable commit in the lab.
	if effect.HTTPOut["POST /captures"] != 1 || effect.HTTPIn["POST /webhooks/provider"] != 2 || effect.HTTPOut["POST /receipts"] != 0 {
		t.Errorf("HTTP per settled effect: out %v, in %v; want 1 capture call and 2 webhooks", effect.HTTPOut, effect.HTTPIn)
	}
	if effect.DurableCommits[cost.Lab] != 2 || effect.DurableCommits[cost.Provider] != 1 {
		t.Errorf("durable commits per settled effect %v; want 2 in the lab (the webhooks) and 1 at the provider (the capture)", effect.DurableCommits)
	}
	// The relay's record of the capture and its completion commit
	// asynchronously: between 1 and 2 (a webhook may have recorded the
	// capture first), plus a claim per batch.
	if got := effect.AsyncCommits[cost.Lab]; got < 1 || got > 2.5 {
		t.Errorf("asynchronous lab commits per settled effect %v; want 1 to 2, and a claim per batch", got)
	}
}
