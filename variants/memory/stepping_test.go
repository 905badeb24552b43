package memory_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
)

// inspect reads the key and checks its state and that a fact holds want.
func inspect(t *testing.T, s *memory.Store, sc lab.Scope, state, want string) {
	t.Helper()
	in, err := s.Inspect(context.Background(), sc)
	if err != nil || in.State != state || in.Where == "" || !strings.Contains(strings.Join(in.Facts, "; "), want) {
		t.Fatalf("inspection %+v (%v): want %s with a fact holding %q", in, err, state, want)
	}
}

// TestSteppedTwinGivesUpOnTheWaitMove plays a stepped run on one replica:
// attempt 1 claims and pauses; attempt 2 finds the claim and waits on it;
// the "wait" move ends that wait at once with 409, not the bound's timer.
// Attempt 1 then charges; the window move forgets the key, and a late
// retry charges again. Inspect follows the key throughout.
func TestSteppedTwinGivesUpOnTheWaitMove(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		books := inmem.NewBooks(time.Now)
		s := newStore(t, memory.Config{Ledger: books, Window: 24 * time.Hour, Wait: time.Second})
		bg := context.Background()
		a := attempt("k-step", 100)
		inspect(t, s, a.Scope, lab.KeyAbsent, "no entry")

		g1, g2 := labtest.NewStepGate("step-t/1"), labtest.NewStepGate("step-t/2")
		first := labtest.ChargeAsync(lab.WithStepGate(bg, g1), s, a)
		g1.At(t, lab.PointBeforeClaim)
		g1.Move()
		g1.At(t, lab.PointAfterClaim)
		inspect(t, s, a.Scope, lab.KeyInFlight, "claimed by attempt 1 (step-t/1)")

		start := time.Now()
		second := labtest.ChargeAsync(lab.WithStepGate(bg, g2), s, a)
		g2.At(t, lab.PointBeforeClaim)
		g2.Move()
		synctest.Wait() // attempt 2 waits on attempt 1's claim
		select {
		case ans := <-second:
			t.Fatalf("attempt 2 answered before the wait move: %+v", ans)
		default:
		}
		g2.EndWaits() // the "wait" move
		ans := <-second
		var busy *lab.InProgressError
		if !errors.As(ans.Err, &busy) {
			t.Fatalf("attempt 2 after the wait move: %+v, want 409 in progress", ans)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("attempt 2 gave up after %s: a timer, not the move, ended its wait", waited)
		}
		if err := s.MakeHappen(bg, a.Scope, lab.EventWait); err != nil {
			t.Fatalf("the wait event on the store: %v", err)
		}
		if err := s.MakeHappen(bg, a.Scope, lab.EventWindow); err != nil {
			t.Fatal(err)
		}
		inspect(t, s, a.Scope, lab.KeyInFlight, "attempt 1") // a claim's window starts when it settles

		g1.Move()
		g1.At(t, lab.PointAfterCharge)
		g1.Move()
		if ans := <-first; ans.Err != nil || ans.Out.Replayed || ans.Out.Response.Status != 201 {
			t.Fatalf("attempt 1: %+v, want its own 201", ans)
		}
		inspect(t, s, a.Scope, lab.KeyCompleted, "completed by attempt 1 (step-t/1): 201, charge ch_")
		inspect(t, s, a.Scope, lab.KeyCompleted, "expires in 24 h 0 m")
		if k, _ := books.KeyCharges(bg, "acme", memory.Name, "k-step"); k.Charges != 1 {
			t.Fatalf("%d charges before the window, want 1", k.Charges)
		}
		if out, err := s.Charge(bg, a); err != nil || !out.Replayed {
			t.Fatalf("a retry within the window: %+v %v, want a replay", out, err)
		}

		if err := s.MakeHappen(bg, a.Scope, lab.EventWindow); err != nil {
			t.Fatal(err)
		}
		inspect(t, s, a.Scope, lab.KeyAbsent, "no entry")
		if out, err := s.Charge(bg, a); err != nil || out.Replayed {
			t.Fatalf("a retry after the window: %+v %v, want a new charge", out, err)
		}
		if k, _ := books.KeyCharges(bg, "acme", memory.Name, "k-step"); k.Charges != 2 {
			t.Fatalf("%d charges after the window, want 2", k.Charges)
		}
		inspect(t, s, a.Scope, lab.KeyCompleted, "completed: 201, charge ch_") // no stepped attempt claimed it
	})
}

// TestSteppedAttemptGivingUpReleasesItsClaim: an attempt whose stepped run
// ends while it pauses after its claim leaves the key free, uncharged.
func TestSteppedAttemptGivingUpReleasesItsClaim(t *testing.T) {
	t.Parallel()
	books := inmem.NewBooks(time.Now)
	s := newStore(t, memory.Config{Ledger: books})
	a := attempt("k-abort", 100)
	g := labtest.NewStepGate("step-t/1")
	ctx, abort := context.WithCancel(lab.WithStepGate(t.Context(), g))
	done := labtest.ChargeAsync(ctx, s, a)
	g.At(t, lab.PointBeforeClaim)
	g.Move()
	g.At(t, lab.PointAfterClaim)
	abort()
	if ans := <-done; !errors.Is(ans.Err, context.Canceled) {
		t.Fatalf("the aborted attempt: %+v, want its context's end", ans)
	}
	inspect(t, s, a.Scope, lab.KeyAbsent, "no entry")
	if k, _ := books.KeyCharges(t.Context(), "acme", memory.Name, "k-abort"); k.Charges != 0 {
		t.Fatalf("%d charges, want none", k.Charges)
	}
}

// TestTimeEventsTheDesignHasNot: a TTL, a lease and a failover mean
// nothing to a map in the heap: each is refused, naming the event.
func TestTimeEventsTheDesignHasNot(t *testing.T) {
	t.Parallel()
	s := newStore(t, memory.Config{})
	for _, ev := range []lab.TimeEvent{lab.EventTTL, lab.EventLease, lab.EventFailover, "eclipse"} {
		var invalid *lab.InvalidError
		if err := s.MakeHappen(t.Context(), attempt("k", 100).Scope, ev); !errors.As(err, &invalid) || invalid.Param != "event" {
			t.Errorf("%s: %v, want an invalid event", ev, err)
		}
	}
}
