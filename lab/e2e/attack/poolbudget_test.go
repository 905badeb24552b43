package attack_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/rediscache"
)

// TestOneConnectionBudgetPerNamespace is the pool-starvation attack: two
// namespaces each flood both stores that hold a connection across slow work
// (postgres and redis+postgres, which share the replica's pool) with long
// slow charges, while a third namespace charges plainly. The third is never
// answered 503, and no namespace ever holds more than its budget of the
// pool — read from the pool itself, not from what the stores intend.
func TestOneConnectionBudgetPerNamespace(t *testing.T) {
	t.Parallel()
	cfg := e2e.FullConfig(t)
	cfg.JoinCode = attackJoinCode
	cfg.PGPoolSize, cfg.InFlightWait = 20, 2*time.Second
	a := labtest.Start(t, cfg)
	base := a.URL()
	x, y, z := joinLab(t, base, attackJoinCode), joinLab(t, base, attackJoinCode), joinLab(t, base, attackJoinCode)
	pools := a.StorePools()
	if len(pools) == 0 {
		t.Fatal("no budgeted store pool")
	}
	budget := pools[0].Budget()
	var floods []<-chan []sent
	for _, at := range []labAttendee{x, y} {
		for _, store := range []lab.StoreName{postgres.Name, rediscache.Name} {
			floods = append(floods, flood(t, chargeRequests(t, base, store, at.Token, fmt.Sprintf("flood-%s-%s", at.Tenant, store), 6, slowFault(holdWork))))
		}
	}
	labtest.Eventually(t, "the attackers holding connections across their slow work", func() bool {
		h := pools[0].Held(x.Namespace)
		return h.AcrossWork >= budget.SlowPerNamespace
	})
	for i := range 30 {
		r, err := labtest.SendCharge(base, postgres.Name, z.Token, fmt.Sprintf("victim-%d", i), e2e.Body2500, nil)
		if err != nil || r.Status != http.StatusCreated {
			t.Fatalf("the third namespace's plain charge %d during the attack: %v %d %s", i, err, r.Status, r.Body)
		}
	}
	for _, f := range floods {
		for _, s := range <-f {
			if s.err != nil {
				t.Errorf("a flooding charge: %v", s.err)
			} else if s.reply.Status != http.StatusCreated {
				labtest.WantProblem(t, "a flooding charge beyond the budget", s.reply, http.StatusServiceUnavailable, "store_unavailable", "")
			}
		}
	}
	for _, at := range []labAttendee{x, y, z} {
		h := pools[0].Held(at.Namespace)
		if h.Peak > budget.PerNamespace || h.PeakAcrossWork > budget.SlowPerNamespace || h.Now != 0 {
			t.Errorf("%s held %+v of the pool; its budget is %+v", at.Tenant, h, budget)
		}
	}
	for i := range 30 {
		if n := e2e.KeyCharges(t, a, z.Tenant, postgres.Name, fmt.Sprintf("victim-%d", i)); n != 1 {
			t.Errorf("victim charge %d: %d charges", i, n)
		}
	}

	// More namespaces than the pool has quarters, each holding its whole
	// budget: one slow claim and its twins, waiting on its row lock with a
	// connection each. The last connections still go to a namespace that
	// holds none.
	// All join first, then all flood at once: twins wait at most the
	// in-flight wait, which a spread of floods on a busy machine outlasts.
	var many []labAttendee
	for range 5 {
		many = append(many, joinLab(t, base, attackJoinCode))
	}
	floods = nil
	for _, at := range many {
		reqs := chargeRequests(t, base, postgres.Name, at.Token, "same-"+at.Tenant, 8, slowFault(holdWork))
		for _, r := range reqs {
			r.Header.Set(lab.KeyHeader, "same-"+at.Tenant) // one key: a claimer and its twins
		}
		floods = append(floods, flood(t, reqs))
	}
	labtest.Eventually(t, "the attackers' namespaces holding their budgets", func() bool {
		held := 0
		for _, at := range many {
			held += pools[0].Held(at.Namespace).Now
		}
		return held >= int(cfg.PGPoolSize)-budget.Reserve-budget.Headroom
	})
	for i := range 10 {
		r, err := labtest.SendCharge(base, postgres.Name, z.Token, fmt.Sprintf("victim-many-%d", i), e2e.Body2500, nil)
		if err != nil || r.Status != http.StatusCreated {
			t.Fatalf("the victim's charge %d among %d attacking namespaces: %v %d %s", i, len(many), err, r.Status, r.Body)
		}
	}
	for _, f := range floods {
		<-f
	}
	for _, at := range many {
		if h := pools[0].Held(at.Namespace); h.Peak > budget.PerNamespace {
			t.Errorf("%s held %+v of the pool; its budget is %+v", at.Tenant, h, budget)
		}
		if n := e2e.KeyCharges(t, a, at.Tenant, postgres.Name, "same-"+at.Tenant); n != 1 {
			t.Errorf("%s's one key was charged %d times", at.Tenant, n)
		}
	}
}
