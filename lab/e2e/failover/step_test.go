package failover_test

import (
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/step"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
)

// stepReply is a stepped run as the routes answer it.
type stepReply struct {
	step.View
	Ledger struct {
		Charges   int      `json:"charges"`
		ChargeIDs []string `json:"charge_ids"`
	} `json:"ledger"`
	Error string `json:"error"`
}

// TestStepSchedulesRepeat plays every named schedule five times (twice on
// the PostgreSQL pair, whose failovers each rebuild a standby): the
// interleaving alone decides the outcome, so the ledger holds the same
// number of charges for the key every time.
func TestStepSchedulesRepeat(t *testing.T) {
	t.Parallel()
	for _, sched := range step.Schedules() {
		t.Run(sched.Name, func(t *testing.T) {
			t.Parallel()
			cfg := e2e.StoreConfig(t, sched.Store)
			faults, err := lab.ParseFaults(sched.Faults)
			if err != nil {
				t.Fatal(err)
			}
			cfg.RedisPair = faults.Point == lab.FaultFailover // two redis-server processes
			a := labtest.Start(t, cfg)
			plays := 5
			if faults.Replication != "" {
				plays = 2
			}
			for i := range plays {
				r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?schedule="+sched.Name, nil, "")
				if r.Status != http.StatusCreated {
					t.Fatalf("play %d: %d %s", i+1, r.Status, r.Body)
				}
				run := labtest.Decode[stepReply](t, r)
				if !run.Over || run.Error != "" {
					t.Fatalf("play %d did not end: %s", i+1, r.Body)
				}
				if faults.Replication != "" { // charged on the PostgreSQL pair, never on the lab's database
					lost := 0
					for _, at := range run.Attempts {
						if at.Answer != nil && at.Answer.ChargeID != "" && !slices.Contains(run.Ledger.ChargeIDs, at.Answer.ChargeID) {
							lost++
						}
					}
					if got := e2e.KeyCharges(t, a, "acme", run.Store, run.Key); got != 0 || run.Ledger.Charges != sched.Charges || lost != sched.Lost {
						t.Fatalf("play %d: the pair's books hold %d charges for %s and %d answered are lost (the lab's own %d), want %d and %d: %s",
							i+1, run.Ledger.Charges, run.Key, lost, got, sched.Charges, sched.Lost, r.Body)
					}
					continue
				}
				if got := e2e.KeyCharges(t, a, "acme", run.Store, run.Key); got != sched.Charges || run.Ledger.Charges != got {
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
	a := labtest.Start(t, e2e.StoreConfig(t, postgres.Name))
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
	if second.State != step.StateBlocked || !strings.Contains(second.Blocked, "held by attempt 1") {
		t.Fatalf("attempt 2 is %s (blocked on %q), want blocked on attempt 1's transaction, as PostgreSQL sees it", second.State, second.Blocked)
	}
	if facts := strings.Join(mid.Holds[0].Facts, "; "); !strings.Contains(facts, "attempt 2 waits on") ||
		!strings.Contains(facts, "attempt 1's transaction is open") || mid.Holds[0].State == lab.KeyCompleted {
		t.Fatalf("the store's state mid-way: %+v", mid.Holds)
	}
	if mid.Ledger.Charges != 0 {
		t.Fatalf("the books show %d charges before attempt 1 committed", mid.Ledger.Charges)
	}
	end := advance("1,1,2")
	if !end.Over || end.Ledger.Charges != 1 || e2e.KeyCharges(t, a, "acme", postgres.Name, end.Key) != 1 {
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
	a := labtest.Start(t, e2e.Config())
	h := http.Header{"Authorization": {"Bearer " + labtest.Acme}, "Idempotency-Key": {"k-step-refused"}, step.Header: {"step-nope/1"}}
	r := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=memory", h, e2e.Body2500)
	if r.Status != http.StatusBadRequest || labtest.Decode[lab.Problem](t, r).Param != step.Header {
		t.Fatalf("want 400 naming %s, got %d %s", step.Header, r.Status, r.Body)
	}
	if got := e2e.KeyCharges(t, a, "acme", "memory", "k-step-refused"); got != 0 {
		t.Fatalf("a refused stepped attempt charged %d times", got)
	}
	// Another namespace's stepped run is no gate for globex.
	started := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store=memory&attempts=2", nil, "")
	if started.Status != http.StatusCreated {
		t.Fatalf("start: %d %s", started.Status, started.Body)
	}
	h.Set("Authorization", "Bearer "+labtest.Globex)
	h.Set(step.Header, labtest.Decode[stepReply](t, started).ID+"/1")
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=memory", h, e2e.Body2500); r.Status != http.StatusBadRequest {
		t.Fatalf("globex joined acme's stepped run: %d %s", r.Status, r.Body)
	}
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store=memory&attempts=2", nil, ""); r.Status != http.StatusConflict {
		t.Fatalf("a second stepped run of one namespace: %d %s", r.Status, r.Body)
	}
}

// TestStepTheTTLsEndIsAMove plays the redis schedule with a 60 s claim TTL:
// the store shows the claim with most of its TTL left before the ttl move
// and nothing after it, so the move, not the clock, ended it; both attempts
// then charge.
func TestStepTheTTLsEndIsAMove(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, redis.Name))
	r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?schedule=redis-ttl-runs-out", nil, "")
	if r.Status != http.StatusCreated {
		t.Fatalf("play: %d %s", r.Status, r.Body)
	}
	run := labtest.Decode[stepReply](t, r)
	at := slices.IndexFunc(run.Moves, func(m step.MoveRecord) bool { return m.Move.Event == lab.EventTTL })
	if at < 1 || !run.Over {
		t.Fatalf("no ttl move in a finished run: %s", r.Body)
	}
	before, after := run.Moves[at-1].Store[0], run.Moves[at].Store[0]
	var left float64
	m := regexp.MustCompile(`TTL ([0-9.]+) s left`).FindStringSubmatch(strings.Join(before.Facts, " "))
	if m != nil {
		left, _ = strconv.ParseFloat(m[1], 64)
	}
	if before.State != lab.KeyInFlight || left < 50 {
		t.Fatalf("before the ttl move the store held %+v, want the claim with 50-odd seconds left", before)
	}
	if after.State != lab.KeyAbsent {
		t.Fatalf("after the ttl move the store held %+v, want nothing", after)
	}
	if got := e2e.KeyCharges(t, a, "acme", redis.Name, run.Key); got != 2 || run.Ledger.Charges != 2 {
		t.Fatalf("the books hold %d charges, want 2: %s", got, r.Body)
	}
}

// TestStepTheWaitMove ends a blocked twin's bounded wait at one move: on
// PostgreSQL the server cancels its lock wait, and the twin answers 409 as
// its lock_timeout would have made it; the owner then charges once.
func TestStepTheWaitMove(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, postgres.Name))
	started := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store=postgres&attempts=2", nil, "")
	if started.Status != http.StatusCreated {
		t.Fatalf("start: %d %s", started.Status, started.Body)
	}
	id := labtest.Decode[stepReply](t, started).ID
	r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step/"+id+"/advance?schedule=1,2,1,2,wait", nil, "")
	v := labtest.Decode[stepReply](t, r)
	if r.Status != http.StatusOK {
		t.Fatalf("advance: %d %s", r.Status, r.Body)
	}
	if ans := v.Attempts[1].Answer; ans == nil || ans.Status != http.StatusConflict || ans.Code != "idempotency_in_progress" {
		t.Fatalf("after the wait move attempt 2 answered %+v, want 409 in_progress", ans)
	}
	r = labtest.Do(t, http.MethodPost, a.URL()+"/lab/step/"+id+"/advance?schedule=1,1", nil, "")
	if v = labtest.Decode[stepReply](t, r); !v.Over || e2e.KeyCharges(t, a, "acme", postgres.Name, v.Key) != 1 {
		t.Fatalf("want one charge once over: %s", r.Body)
	}
}

// TestStepSeededSchedules: a seed draws an interleaving, and the same seed
// draws the same one with the same outcome.
func TestStepSeededSchedules(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	play := func(seed string) stepReply {
		t.Helper()
		started := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store=look-first&attempts=3", nil, "")
		id := labtest.Decode[stepReply](t, started).ID
		r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step/"+id+"/advance?seed="+seed, nil, "")
		v := labtest.Decode[stepReply](t, r)
		if r.Status != http.StatusOK || !v.Over {
			t.Fatalf("seed %s: %d %s", seed, r.Status, r.Body)
		}
		return v
	}
	for _, seed := range []string{"1", "7", "42"} {
		x, y := play(seed), play(seed)
		if step.FormatMoves(x.Steps) != step.FormatMoves(y.Steps) || x.Ledger.Charges != y.Ledger.Charges {
			t.Fatalf("seed %s drew %s (%d charges), then %s (%d)", seed, step.FormatMoves(x.Steps), x.Ledger.Charges,
				step.FormatMoves(y.Steps), y.Ledger.Charges)
		}
		if got := e2e.KeyCharges(t, a, "acme", "look-first", y.Key); got != y.Ledger.Charges || got < 1 {
			t.Fatalf("seed %s: the books hold %d charges, the answer says %d", seed, got, y.Ledger.Charges)
		}
	}
}

// TestAStepppedRunIsARun: once over, a stepped run is in the run history,
// its history checked: look-first's double charge is a violation,
// PostgreSQL's one charge linearizable.
func TestAStepppedRunIsARun(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, postgres.Name))
	for name, want := range map[string]string{"look-first-both-look": "violation", "postgres-both-claim": "linearizable"} {
		r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?schedule="+name, nil, "")
		run := labtest.Decode[stepReply](t, r)
		if run.Verdict == nil || run.Checked != want {
			t.Fatalf("%s: checked %+v, want %s: %s", name, run.Verdict, want, r.Body)
		}
		got := labtest.Do(t, http.MethodGet, a.URL()+"/lab/runs/"+run.RunID, nil, "")
		rep := labtest.Decode[struct {
			Checked  string `json:"checked"`
			Scenario string `json:"scenario"`
			Key      int    `json:"key_charges"`
		}](t, got)
		if got.Status != http.StatusOK || rep.Checked != want || rep.Scenario != "stepped" || rep.Key != run.Ledger.Charges {
			t.Fatalf("%s in the history: %d %s", name, got.Status, got.Body)
		}
		if h := labtest.Do(t, http.MethodGet, a.URL()+"/lab/runs/"+run.RunID+"/history.html", nil, ""); h.Status != http.StatusOK {
			t.Fatalf("%s's history picture: %d", name, h.Status)
		}
	}
}

// TestStepRefusesTimeDrivenFaults: a fault that time decides is a move in
// a stepped run, and asking for it is a 400 naming the move.
func TestStepRefusesTimeDrivenFaults(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store=memory&attempts=2&fault=stale_worker", nil, "")
	if p := labtest.Decode[lab.Problem](t, r); r.Status != http.StatusBadRequest || p.Param != "fault" || !strings.Contains(p.Detail, "lease move") {
		t.Fatalf("want 400 naming fault: %d %s", r.Status, r.Body)
	}
	r = labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store=memory&attempts=2", nil, "")
	id := labtest.Decode[stepReply](t, r).ID
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step/"+id+"/advance?event=lease", nil, ""); r.Status != http.StatusBadRequest {
		t.Fatalf("a lease move on memory: %d %s", r.Status, r.Body)
	}
}

// TestStepAbort: GET /lab/step names the namespace's open run, and
// aborting it rolls back what its attempts held: the claim is released, so
// the key charges once afterwards, and another run can start at once.
func TestStepAbort(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	started := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store=memory&attempts=2", nil, "")
	id := labtest.Decode[stepReply](t, started).ID
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step/"+id+"/advance?schedule=1,1", nil, ""); r.Status != http.StatusOK {
		t.Fatalf("advance: %d %s", r.Status, r.Body)
	}
	index := labtest.Decode[struct {
		Current     string                            `json:"current"`
		StoreEvents map[lab.StoreName][]lab.TimeEvent `json:"store_events"`
	}](t, labtest.Do(t, http.MethodGet, a.URL()+"/lab/step", nil, ""))
	if index.Current != id || !slices.Contains(index.StoreEvents["memory"], lab.EventWait) {
		t.Fatalf("the index names %q as current (want %s), events %v", index.Current, id, index.StoreEvents)
	}
	r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step/"+id+"/abort", nil, "")
	if v := labtest.Decode[stepReply](t, r); r.Status != http.StatusOK || v.Aborted == "" {
		t.Fatalf("abort: %d %s", r.Status, r.Body)
	}
	h := http.Header{"Authorization": {"Bearer " + labtest.Acme}, "Idempotency-Key": {id}}
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=memory", h, e2e.Body2500); r.Status != http.StatusCreated {
		t.Fatalf("the aborted run's key after the abort: %d %s", r.Status, r.Body)
	}
	if got := e2e.KeyCharges(t, a, "acme", "memory", id); got != 1 {
		t.Fatalf("the key holds %d charges after the abort and one charge", got)
	}
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store=memory&attempts=2", nil, ""); r.Status != http.StatusCreated {
		t.Fatalf("a run after the abort: %d %s", r.Status, r.Body)
	}
}

// TestStepWithACrash: a fault of the first attempt goes with a stepped run.
// Crashed after its charge, memory forgets the key and the retry charges
// again; postgres committed the key with the charge, and the retry replays.
func TestStepWithACrash(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, postgres.Name))
	// Attempt 1 to its crash (memory dies right after its charge, postgres
	// after its commit, past after_charge), then attempt 2 to its answer.
	for store, c := range map[string]struct {
		moves string
		want  int
	}{"memory": {"1,1,1,2,2,2,2", 2}, "postgres": {"1,1,1,1,2,2,2", 1}} {
		want := c.want
		started := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step?store="+store+"&attempts=2&fault=crash_after_charge", nil, "")
		if started.Status != http.StatusCreated {
			t.Fatalf("%s: start: %d %s", store, started.Status, started.Body)
		}
		run := labtest.Decode[stepReply](t, started)
		r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/step/"+run.ID+"/advance?schedule="+c.moves, nil, "")
		v := labtest.Decode[stepReply](t, r)
		if r.Status != http.StatusOK || !v.Over || v.Faults != "crash_after_charge" {
			t.Fatalf("%s: %d %s", store, r.Status, r.Body)
		}
		if ans := v.Attempts[0].Answer; ans == nil || ans.Status != 0 || ans.Error == "" {
			t.Fatalf("%s: the crashed attempt got %+v, want no answer", store, ans)
		}
		if got := e2e.KeyCharges(t, a, "acme", lab.StoreName(store), v.Key); got != want || v.Ledger.Charges != want {
			t.Fatalf("%s: the books hold %d charges after the crash (the answer says %d), want %d", store, got, v.Ledger.Charges, want)
		}
	}
}
