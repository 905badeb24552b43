package lease_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/testsignal"
	"github.com/idempotency-lab/lab/variants/lease"
)

// answerOf waits for an attempt's answer.
func answerOf(t *testing.T, who string, done <-chan labtest.Answer) labtest.Answer {
	t.Helper()
	return testsignal.Receive(t, who+"'s answer", done)
}

// inspect reads the key and checks its state and that its facts hold each of want.
func inspect(t *testing.T, s *lease.Store, sc lab.Scope, state string, want ...string) {
	t.Helper()
	in, err := s.Inspect(t.Context(), sc)
	facts := strings.Join(in.Facts, "; ")
	if err != nil || in.State != state || in.Where == "" {
		t.Fatalf("inspection %+v (%v): want %s", in, err, state)
	}
	for _, w := range want {
		if !strings.Contains(facts, w) {
			t.Fatalf("inspection %+v: want a fact holding %q", in, w)
		}
	}
}

// ledger is what the database holds for the key: its charges, the token
// the newest was written with, and the writes the fence refused.
func ledger(t *testing.T, pool *pgxpool.Pool, key string) (charges int, token int64, fenced []int64) {
	t.Helper()
	ctx := t.Context()
	if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(max(fence_token), 0) FROM charges WHERE tenant_id = 'acme' AND idempotency_key = $1`,
		key).Scan(&charges, &token); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT stale_token FROM fenced_writes WHERE tenant_id = 'acme' AND idempotency_key = $1 ORDER BY refused_at`, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			t.Fatal(err)
		}
		fenced = append(fenced, tok)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return charges, token, fenced
}

// TestSteppedStaleWorkerIsFenced plays lease-stale-worker-fenced move by
// move (1,1,lease,2,2,2,1) with a gate per attempt: attempt 1 claims and
// pauses, renewing nothing; its lease ends; attempt 2 takes the key over
// with a higher token and charges; attempt 1's write is refused by the
// ledger and it answers with attempt 2's charge. One charge, one fenced write.
func TestSteppedStaleWorkerIsFenced(t *testing.T) {
	clock := labtest.NewClock(time.Now())
	s, pool := setup(t, clock.Now)
	signals := lease.ArmSignals(s)
	ctx := t.Context()
	const key = "k-step-fenced"
	a := attempt(key, lab.Faults{})
	g1, g2 := labtest.NewStepGate("step-f/1"), labtest.NewStepGate("step-f/2")
	inspect(t, s, a.Scope, lab.KeyAbsent, "no row")

	first := labtest.ChargeAsync(lab.WithStepGate(ctx, g1), s, a) // 1: sent
	g1.At(t, lab.PointBeforeClaim)
	g1.Move() // 1: claims
	g1.At(t, lab.PointAfterClaim)
	stale := signals.WaitClaimed(t)
	inspect(t, s, a.Scope, lab.KeyInFlight, "token "+strconv.FormatInt(stale, 10)+", won by attempt 1 (step-f/1)", "lease ends in 1 m 0 s")

	if err := s.MakeHappen(ctx, a.Scope, lab.EventLease); err != nil { // lease
		t.Fatal(err)
	}
	inspect(t, s, a.Scope, lab.KeyInFlight, "lease ended 0 ms ago")
	if k, err := s.Lookup(ctx, a.Scope); err != nil || k.State != lab.KeyAbsent {
		t.Fatalf("key after the lease move: %+v (%v); want it free to take over", k, err)
	}

	second := labtest.ChargeAsync(lab.WithStepGate(ctx, g2), s, a) // 2: sent
	g2.At(t, lab.PointBeforeClaim)
	g2.Move() // 2: takes over
	g2.At(t, lab.PointAfterClaim)
	taken := signals.WaitClaimed(t)
	if taken <= stale {
		t.Fatalf("the take-over won token %d, want one above %d", taken, stale)
	}
	inspect(t, s, a.Scope, lab.KeyInFlight, "token "+strconv.FormatInt(taken, 10)+", won by attempt 2 (step-f/2)", "lease ends in")

	g2.Move() // 2: writes, charges, answers
	took := answerOf(t, "attempt 2", second)
	if took.Err != nil || took.Out.Replayed || took.Out.Response.Status != http.StatusCreated {
		t.Fatalf("attempt 2: %+v %v; want its own 201", took.Out, took.Err)
	}
	inspect(t, s, a.Scope, lab.KeyCompleted, "completed: 201, charge ch_")

	g1.Move() // 1: writes with the stale token, fenced
	fenced := answerOf(t, "attempt 1", first)
	if fenced.Err != nil || !fenced.Out.Replayed || string(fenced.Out.Response.Body) != string(took.Out.Response.Body) {
		t.Fatalf("attempt 1: %+v %v; want attempt 2's charge replayed to it", fenced.Out, fenced.Err)
	}
	inspect(t, s, a.Scope, lab.KeyCompleted, "a write with stale token "+strconv.FormatInt(stale, 10)+" was fenced")

	charges, token, refused := ledger(t, pool, key)
	if charges != 1 || token != taken || len(refused) != 1 || refused[0] != stale {
		t.Fatalf("ledger: %d charge(s) with token %d, fenced %v; want one with token %d, and token %d fenced once",
			charges, token, refused, taken, stale)
	}
	if renewing := signals.Renewing(); len(renewing) != 0 {
		t.Fatalf("heartbeats started for tokens %v: a stepped attempt renews nothing", renewing)
	}
}

// TestSteppedTwinGivesUpOnTheWaitMove: a twin polling a live claim answers
// 202 pending when the wait move ends its bounded wait, long before the
// bound (10 minutes here) would. Then the window move makes the completed
// key's retention end: a late retry takes it over and charges again.
func TestSteppedTwinGivesUpOnTheWaitMove(t *testing.T) {
	clock := labtest.NewClock(time.Now())
	s, pool := setupWait(t, clock.Now, 10*time.Minute)
	signals := lease.ArmSignals(s)
	ctx := t.Context()
	const key = "k-step-wait"
	a := attempt(key, lab.Faults{})
	g1, g2 := labtest.NewStepGate("step-w/1"), labtest.NewStepGate("step-w/2")
	first := labtest.ChargeAsync(lab.WithStepGate(ctx, g1), s, a)
	g1.At(t, lab.PointBeforeClaim)
	g1.Move()
	g1.At(t, lab.PointAfterClaim)
	token := signals.WaitClaimed(t)

	second := labtest.ChargeAsync(lab.WithStepGate(ctx, g2), s, a)
	g2.At(t, lab.PointBeforeClaim)
	g2.Move() // finds the live claim and polls it
	g2.EndWaits()
	if err := s.MakeHappen(ctx, a.Scope, lab.EventWait); err != nil {
		t.Fatal(err)
	}
	ans := answerOf(t, "attempt 2", second)
	if ans.Err != nil || ans.Out.Pending == nil || ans.Out.Pending.Token != token {
		t.Fatalf("attempt 2 after the wait move: %+v %v; want 202 pending on token %d", ans.Out, ans.Err, token)
	}

	g1.Move()
	if done := answerOf(t, "attempt 1", first); done.Err != nil || done.Out.Response.Status != http.StatusCreated {
		t.Fatalf("attempt 1: %+v %v", done.Out, done.Err)
	}
	if charges, _, _ := ledger(t, pool, key); charges != 1 {
		t.Fatalf("%d charges before the window, want 1", charges)
	}
	if err := s.MakeHappen(ctx, a.Scope, lab.EventWindow); err != nil {
		t.Fatal(err)
	}
	inspect(t, s, a.Scope, lab.KeyCompleted, "its retention ended 0 ms ago: the next attempt takes the key over")
	late, err := s.Charge(ctx, a)
	if err != nil || late.Replayed || late.Response.Status != http.StatusCreated {
		t.Fatalf("a retry after the window: %+v %v; want a new charge", late, err)
	}
	if charges, _, _ := ledger(t, pool, key); charges != 2 {
		t.Fatalf("%d charges after the window, want 2", charges)
	}
	signals.WaitClaimed(t) // the late retry's
}

// TestSteppedAttemptGivingUpReleasesItsClaim: an attempt whose stepped run
// ends while it pauses after its claim releases it, as failed work does:
// a retry takes over at once, not a lease later, and charges once.
func TestSteppedAttemptGivingUpReleasesItsClaim(t *testing.T) {
	clock := labtest.NewClock(time.Now())
	s, pool := setup(t, clock.Now)
	signals := lease.ArmSignals(s)
	const key = "k-step-abort"
	a := attempt(key, lab.Faults{})
	g := labtest.NewStepGate("step-a/1")
	ctx, abort := context.WithCancel(lab.WithStepGate(t.Context(), g))
	done := labtest.ChargeAsync(ctx, s, a)
	g.At(t, lab.PointBeforeClaim)
	g.Move()
	g.At(t, lab.PointAfterClaim)
	signals.WaitClaimed(t)
	abort()
	if ans := answerOf(t, "the aborted attempt", done); !errors.Is(ans.Err, context.Canceled) {
		t.Fatalf("the aborted attempt: %+v %v; want its context's end", ans.Out, ans.Err)
	}
	inspect(t, s, a.Scope, lab.KeyInFlight, "lease ended 0 ms ago")
	out, err := s.Charge(t.Context(), a)
	if err != nil || out.Replayed || out.Response.Status != http.StatusCreated {
		t.Fatalf("the retry: %+v %v; want it to take over and charge", out, err)
	}
	signals.WaitClaimed(t)
	if charges, _, fenced := ledger(t, pool, key); charges != 1 || len(fenced) != 0 {
		t.Fatalf("ledger: %d charge(s), fenced %v; want one, none fenced", charges, fenced)
	}
}

// TestTimeEventsTheDesignHasNot: a TTL and a failover mean nothing to a
// lease in PostgreSQL: each is refused, naming the event.
func TestTimeEventsTheDesignHasNot(t *testing.T) {
	s, _ := setup(t, time.Now)
	for _, ev := range []lab.TimeEvent{lab.EventTTL, lab.EventFailover, "eclipse"} {
		var invalid *lab.InvalidError
		if err := s.MakeHappen(t.Context(), attempt("k", lab.Faults{}).Scope, ev); !errors.As(err, &invalid) || invalid.Param != "event" {
			t.Errorf("%s: %v, want an invalid event", ev, err)
		}
	}
}
