package e2e_test

import (
	"net/http"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/step"
	"github.com/idempotency-lab/lab/variants/postgres"
)

// stepReply is a stepped run as the routes answer it.
type stepReply struct {
	step.View
	Ledger struct {
		Charges int `json:"charges"`
	} `json:"ledger"`
	Error string `json:"error"`
}

// TestStepSchedulesRepeat plays every named schedule 20 times: the
// interleaving alone decides the outcome, so the ledger holds the same
// number of charges for the key every time.
func TestStepSchedulesRepeat(t *testing.T) {
	t.Parallel()
	for _, sched := range step.Schedules() {
		t.Run(sched.Name, func(t *testing.T) {
			t.Parallel()
			a := labtest.Start(t, storeConfig(t, sched.Store))
			for i := range 20 {
				r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?schedule="+sched.Name, nil, "")
				if r.Status != http.StatusCreated {
					t.Fatalf("play %d: %d %s", i+1, r.Status, r.Body)
				}
				run := labtest.Decode[stepReply](t, r)
				if !run.Over || run.Error != "" {
					t.Fatalf("play %d did not end: %s", i+1, r.Body)
				}
				if got := keyCharges(t, a, "acme", run.Store, run.Key); got != sched.Charges || run.Ledger.Charges != got {
					t.Fatalf("play %d: the books hold %d charges for %s (answer says %d), want %d: %s",
						i+1, got, run.Key, run.Ledger.Charges, sched.Charges, r.Body)
				}
			}
		})
	}
}

// TestStepPostgresShowsTheBlock stops the postgres schedule halfway: attempt
// 1 sits inside its transaction after the claim, attempt 2 waits on the
// unique index; then attempt 1 commits and attempt 2 replays.
func TestStepPostgresShowsTheBlock(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, storeConfig(t, postgres.Name))
	started := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store=postgres&attempts=2&replicas=2", nil, "")
	if started.Status != http.StatusCreated {
		t.Fatalf("start: %d %s", started.Status, started.Body)
	}
	id := labtest.Decode[stepReply](t, started).ID
	advance := func(schedule string) stepReply {
		t.Helper()
		r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step/"+id+"/advance?schedule="+schedule, nil, "")
		if r.Status != http.StatusOK {
			t.Fatalf("advance %s: %d %s", schedule, r.Status, r.Body)
		}
		return labtest.Decode[stepReply](t, r)
	}
	advance("1,2,1,2")
	mid := labtest.Decode[stepReply](t, labtest.Do(t, http.MethodGet, a.URL()+"/lab/step/"+id, nil, ""))
	first, second := mid.Attempts[0], mid.Attempts[1]
	if first.State != step.StatePaused || first.Point != lab.PointAfterClaim {
		t.Fatalf("attempt 1 is %s at %q, want paused at after_claim", first.State, first.Point)
	}
	if second.State != step.StateBlocked || second.Blocked == "" {
		t.Fatalf("attempt 2 is %s (blocked on %q), want blocked", second.State, second.Blocked)
	}
	if mid.Ledger.Charges != 0 {
		t.Fatalf("the books show %d charges before attempt 1 committed", mid.Ledger.Charges)
	}
	end := advance("1,1,2")
	if !end.Over || end.Ledger.Charges != 1 || keyCharges(t, a, "acme", postgres.Name, end.Key) != 1 {
		t.Fatalf("want one charge once over: %+v", end)
	}
	if ans := end.Attempts[1].Answer; ans == nil || !ans.Replayed || ans.Status != http.StatusCreated ||
		ans.ChargeID != end.Attempts[0].Answer.ChargeID {
		t.Fatalf("attempt 2 did not replay attempt 1's charge: %+v, %+v", end.Attempts[1].Answer, end.Attempts[0].Answer)
	}
}

// TestStepHeaderRefused: a Lab-Step header naming no stepped run of the
// caller's namespace is a 400, and charges nothing.
func TestStepHeaderRefused(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, labConfig())
	h := http.Header{"Authorization": {"Bearer " + labtest.Acme}, "Idempotency-Key": {"k-step-refused"}, step.Header: {"step-nope/1"}}
	r := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=memory", h, body2500)
	if r.Status != http.StatusBadRequest || labtest.Decode[lab.Problem](t, r).Param != step.Header {
		t.Fatalf("want 400 naming %s, got %d %s", step.Header, r.Status, r.Body)
	}
	if got := keyCharges(t, a, "acme", "memory", "k-step-refused"); got != 0 {
		t.Fatalf("a refused stepped attempt charged %d times", got)
	}
	// Another namespace's stepped run is no gate for globex.
	started := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store=memory&attempts=2", nil, "")
	if started.Status != http.StatusCreated {
		t.Fatalf("start: %d %s", started.Status, started.Body)
	}
	h.Set("Authorization", "Bearer "+labtest.Globex)
	h.Set(step.Header, labtest.Decode[stepReply](t, started).ID+"/1")
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=memory", h, body2500); r.Status != http.StatusBadRequest {
		t.Fatalf("globex joined acme's stepped run: %d %s", r.Status, r.Body)
	}
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store=memory&attempts=2", nil, ""); r.Status != http.StatusConflict {
		t.Fatalf("a second stepped run of one namespace: %d %s", r.Status, r.Body)
	}
}
