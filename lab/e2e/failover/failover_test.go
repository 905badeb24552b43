package failover_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/lease"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
)

// TestRedisFailoverLosesTheClaim runs the failover fault on two real
// redis-server processes: redis charges twice (the new primary never heard
// of the key), postgres and lease charge once.
func TestRedisFailoverLosesTheClaim(t *testing.T) {
	t.Parallel()
	cfg := e2e.FullConfig(t)
	cfg.RedisPair = true
	a := labtest.Start(t, cfg)
	want := map[lab.StoreName]struct {
		verdict lab.Verdict
		charges int
	}{redis.Name: {lab.Breaks, 2}, postgres.Name: {lab.Holds, 1}, lease.Name: {lab.Holds, 1}}
	for _, store := range []lab.StoreName{redis.Name, postgres.Name, lease.Name} {
		r := labtest.Do(t, http.MethodGet, a.URL()+"/charge-idempotent?store="+string(store)+"&key=k-failover-"+string(store)+"&fault=failover&attempts=3", nil, "")
		if r.Status != http.StatusOK {
			t.Fatalf("%s: %d %s", store, r.Status, r.Body)
		}
		rep := labtest.Decode[experiment.Report](t, r)
		if w := want[store]; rep.Verdict != w.verdict || rep.KeyCharges != w.charges || e2e.KeyCharges(t, a, "acme", store, rep.Key) != w.charges {
			t.Errorf("%s: %s with %d charges, want %s with %d: %s", store, rep.Verdict, rep.KeyCharges, w.verdict, w.charges, rep.Explanation)
		}
	}
	// One failover at a time: a promote without a hold is refused, and the
	// pair is whole again for the next run.
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/failover?step=promote", nil, ""); r.Status != http.StatusBadRequest {
		t.Fatalf("promote without hold: %d %s", r.Status, r.Body)
	}
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/failover?step=hold", nil, ""); r.Status != http.StatusOK {
		t.Fatalf("hold: %d %s", r.Status, r.Body)
	}
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/failover?step=hold", nil, ""); r.Status != http.StatusConflict {
		t.Fatalf("a second hold: %d %s", r.Status, r.Body)
	}
	// Another namespace can neither take the pair nor end this failover,
	// and its failover run says why.
	globex := labtest.Bearer(labtest.Globex)
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/failover?step=promote", globex, ""); r.Status != http.StatusConflict {
		t.Fatalf("another namespace's promote: %d %s", r.Status, r.Body)
	}
	// A hold nobody promotes blocks nobody for long: globex's failover run
	// waits for acme's hold to pass its deadline, ends it and runs, and acme,
	// holding again meanwhile, is told to wait its turn.
	start := time.Now()
	blocked := make(chan labtest.Reply, 1)
	go func() {
		blocked <- labtest.Do(t, http.MethodGet, a.URL()+"/charge-idempotent?store=redis&key=k-waited&fault=failover&attempts=2", globex, "")
	}()
	r := <-blocked
	if r.Status != http.StatusOK || time.Since(start) < 4*time.Second {
		t.Fatalf("a failover run while another's hold lasted: %d after %s %s", r.Status, time.Since(start), r.Body)
	}
	if rep := labtest.Decode[experiment.Report](t, r); rep.Verdict != lab.Breaks || rep.KeyCharges != 2 {
		t.Errorf("globex's failover run after waiting: %s with %d charges: %s", rep.Verdict, rep.KeyCharges, rep.Explanation)
	}
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/failover?step=promote", nil, ""); r.Status != http.StatusBadRequest {
		t.Fatalf("acme's promote of the hold that was ended: %d %s", r.Status, r.Body)
	}
}
