package step_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/step"
)

// script is what one fake attempt does once it holds its gate: the points
// it reaches, then, if set, a wait on the store before its last point.
type script struct {
	points  []lab.PausePoint
	blockOn chan struct{}  // closed by another attempt's end; nil for none
	after   lab.PausePoint // reached once unblocked
	release chan struct{}  // closed when this attempt ends
}

// setup starts a registry in a bubble's time and a two-attempt run of
// namespace "ns" whose attempts follow scripts, as a store's path would.
func setup(t *testing.T, idle time.Duration, scripts ...script) (*step.Registry, *step.Run, []error) {
	t.Helper()
	reg, err := step.NewRegistry(step.Config{Settle: 300 * time.Millisecond, Idle: idle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	reached := make([]error, len(scripts)) // the first error a gate gave each attempt
	send := func(ctx context.Context, n int, _, header string) step.Answer {
		g, err := reg.Gate("ns", header)
		if err != nil {
			return step.Answer{Error: err.Error()}
		}
		sc := scripts[n-1]
		if sc.release != nil {
			defer close(sc.release)
		}
		for _, p := range sc.points {
			if err := g.Reach(ctx, p); err != nil {
				reached[n-1] = err
				return step.Answer{Error: err.Error()}
			}
		}
		if sc.blockOn != nil {
			select {
			case <-sc.blockOn:
			case <-ctx.Done():
				return step.Answer{Error: ctx.Err().Error()}
			}
			if err := g.Reach(ctx, sc.after); err != nil {
				reached[n-1] = err
				return step.Answer{Error: err.Error()}
			}
		}
		return step.Answer{Status: 201, ChargeID: "ch", Replayed: n > 1}
	}
	run, err := reg.Start(step.Spec{Namespace: "ns", Store: "memory", Attempts: len(scripts), Replicas: slices.Repeat([]string{"r1"}, len(scripts))}, hooks(send))
	if err != nil {
		t.Fatal(err)
	}
	return reg, run, reached
}

func stand(t *testing.T, run *step.Run, n int) step.AttemptView {
	t.Helper()
	return run.View().Attempts[n-1]
}

func TestAdvance(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := []lab.PausePoint{lab.PointBeforeClaim, lab.PointAfterClaim}
		_, run, _ := setup(t, time.Minute, script{points: path}, script{points: path[:1]})
		if a := stand(t, run, 1); a.State != step.StateReady {
			t.Fatalf("before any advance attempt 1 is %s", a.State)
		}
		for i, want := range path {
			if err := run.Advance(t.Context(), step.A(1)); err != nil {
				t.Fatal(err)
			}
			if a := stand(t, run, 1); a.State != step.StatePaused || a.Point != want || len(a.Passed) != i+1 {
				t.Fatalf("after move %d attempt 1 is %+v, want paused at %s", i+1, a, want)
			}
		}
		if err := run.Play(t.Context(), moves(1, 2, 2)); err != nil {
			t.Fatal(err)
		}
		v := run.View()
		if !v.Over || v.Attempts[0].Answer == nil || v.Attempts[1].Answer == nil || !v.Attempts[1].Answer.Replayed {
			t.Fatalf("want both answered: %+v", v)
		}
		if step.FormatMoves(v.Steps) != "1,1,1,2,2" {
			t.Fatalf("steps %v", v.Steps)
		}
		if err := run.Advance(t.Context(), step.A(1)); !errors.Is(err, step.ErrFinished) {
			t.Fatalf("an advance after the end: %v", err)
		}
	})
}

// TestBlockedThenReleased: an attempt that waits in the store is blocked
// after the settle time, and the end of the attempt it waits on moves it to
// its next point before that advance returns.
func TestBlockedThenReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ended := make(chan struct{})
		_, run, _ := setup(t, time.Minute,
			script{points: []lab.PausePoint{lab.PointBeforeClaim, lab.PointAfterClaim}, release: ended},
			script{points: []lab.PausePoint{lab.PointBeforeClaim}, blockOn: ended, after: lab.PointBeforeReplayRead})
		if err := run.Play(t.Context(), moves(1, 2, 1, 2)); err != nil {
			t.Fatal(err)
		}
		if a := stand(t, run, 2); a.State != step.StateBlocked || a.Blocked == "" {
			t.Fatalf("attempt 2 is %+v, want blocked", a)
		}
		if err := run.Advance(t.Context(), step.A(1)); err != nil {
			t.Fatal(err)
		}
		if a := stand(t, run, 2); a.State != step.StatePaused || a.Point != lab.PointBeforeReplayRead {
			t.Fatalf("attempt 2 is %+v, want paused at before_replay_read once attempt 1 ended", a)
		}
		if err := run.Advance(t.Context(), step.A(2)); err != nil || !run.View().Over {
			t.Fatalf("err=%v, view %+v", err, run.View())
		}
	})
}

func TestIdleRunIsAborted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := []lab.PausePoint{lab.PointBeforeClaim}
		reg, run, reached := setup(t, time.Minute, script{points: path}, script{points: path})
		if err := run.Advance(t.Context(), step.A(1)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		if v := run.View(); v.Aborted == "" || v.Attempts[0].State != step.StateAnswered {
			t.Fatalf("an idle run was not aborted: %+v", v)
		}
		if !errors.Is(reached[0], step.ErrAborted) {
			t.Fatalf("the paused attempt's gate gave %v", reached[0])
		}
		if err := run.Advance(t.Context(), step.A(2)); !errors.Is(err, step.ErrAborted) {
			t.Fatalf("advancing an aborted run: %v", err)
		}
		if _, err := reg.Start(step.Spec{Namespace: "ns", Attempts: 2, Replicas: []string{"r1", "r1"}}, hooks(nil)); err != nil {
			t.Fatalf("an aborted run still holds its namespace: %v", err)
		}
	})
}

func TestOneRunPerNamespace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg, run, _ := setup(t, time.Minute, script{}, script{})
		spec := step.Spec{Namespace: "ns", Attempts: 2, Replicas: []string{"r1", "r1"}}
		if _, err := reg.Start(spec, hooks(nil)); !errors.Is(err, step.ErrRunning) {
			t.Fatalf("a second run of one namespace: %v", err)
		}
		spec.Namespace = "other"
		if _, err := reg.Start(spec, hooks(nil)); err != nil {
			t.Fatalf("another namespace's run: %v", err)
		}
		if _, err := reg.Find("other", run.ID()); !errors.Is(err, step.ErrNotFound) {
			t.Fatalf("a run found from another namespace: %v", err)
		}
	})
}

func TestGateRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg, run, _ := setup(t, time.Minute, script{points: []lab.PausePoint{lab.PointBeforeClaim}}, script{})
		for name, header := range map[string]string{
			"Malformed":      "nope",
			"OtherNamespace": "step-unknown/1",
			"NotSentYet":     run.ID() + "/2",
			"OutOfRange":     run.ID() + "/9",
		} {
			if _, err := reg.Gate("ns", header); err == nil {
				t.Errorf("%s: gate given for %q", name, header)
			}
		}
		if err := run.Advance(t.Context(), step.A(1)); err != nil {
			t.Fatal(err)
		}
		if _, err := reg.Gate("ns", run.ID()+"/1"); err == nil {
			t.Error("a second request took the gate of attempt 1")
		}
		if _, err := reg.Gate("other", run.ID()+"/1"); err == nil {
			t.Error("another namespace took a gate")
		}
	})
}

func TestParseMoves(t *testing.T) {
	if got, err := step.ParseMoves("2,1, ttl,2", 2); err != nil || step.FormatMoves(got) != "2,1,ttl,2" {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "1,3", "0", "1,,2", "a", "TTL"} {
		if _, err := step.ParseMoves(bad, 2); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	b, err := json.Marshal(moves(1, 2))
	if err != nil || string(b) != "[1,2]" {
		t.Fatalf("moves as JSON: %s %v", b, err)
	}
	var back []step.Move
	if err := json.Unmarshal([]byte(`[1,"lease",2]`), &back); err != nil || step.FormatMoves(back) != "1,lease,2" {
		t.Fatalf("moves from JSON: %v %v", back, err)
	}
}

func TestSchedulesAreWellFormed(t *testing.T) {
	for _, s := range step.Schedules() {
		if _, err := step.ParseMoves(step.FormatMoves(s.Steps), s.Attempts); err != nil || s.Replicas < 1 || s.Charges < 1 {
			t.Errorf("%s: %v (replicas %d, charges %d)", s.Name, err, s.Replicas, s.Charges)
		}
		if got, ok := step.FindSchedule(s.Name); !ok || got.Name != s.Name {
			t.Errorf("%s not found by name", s.Name)
		}
	}
}

// moves are attempts' moves.
func moves(ns ...int) []step.Move {
	out := make([]step.Move, len(ns))
	for i, n := range ns {
		out[i] = step.A(n)
	}
	return out
}

// hooks sends with send and does nothing else.
func hooks(send step.Sender) step.Hooks {
	if send == nil {
		send = func(context.Context, int, string, string) step.Answer { return step.Answer{Status: 201} }
	}
	return step.Hooks{
		Send:    send,
		Happen:  func(context.Context, lab.TimeEvent) (string, error) { return "it happened", nil },
		Inspect: func(context.Context) []lab.KeyInspection { return nil },
		Over:    func(context.Context, step.View) step.Verdict { return step.Verdict{RunID: "r"} },
	}
}

// TestTimeMoves: an event is a move of its own, recorded with what it did;
// the wait move ends the bounded wait of an attempt blocked in the store,
// which then answers as its wait's end makes it; the finished run is
// recorded once, and a seed draws the same moves every time.
func TestTimeMoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg, err := step.NewRegistry(step.Config{Settle: 300 * time.Millisecond, Idle: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close()
		var happened []lab.TimeEvent
		overs := 0
		h := hooks(nil)
		h.Send = func(ctx context.Context, n int, _, header string) step.Answer {
			g, err := reg.Gate("ns", header)
			if err != nil {
				return step.Answer{Error: err.Error()}
			}
			if err := g.Reach(ctx, lab.PointBeforeClaim); err != nil {
				return step.Answer{Error: err.Error()}
			}
			if n == 2 { // blocked on attempt 1's claim until the bound ends
				wait, stop := lab.WaitBound(lab.WithStepGate(ctx, g), time.Second)
				defer stop()
				<-wait.Done()
				return step.Answer{Status: 409, Code: "idempotency_in_progress"}
			}
			return step.Answer{Status: 201, ChargeID: "ch"}
		}
		h.Happen = func(_ context.Context, e lab.TimeEvent) (string, error) {
			happened = append(happened, e)
			return "it happened", nil
		}
		h.Over = func(context.Context, step.View) step.Verdict {
			overs++
			return step.Verdict{RunID: "r", Checked: "linearizable"}
		}
		run, err := reg.Start(step.Spec{Namespace: "ns", Store: "memory", Attempts: 2, Replicas: []string{"r1", "r1"}}, h)
		if err != nil {
			t.Fatal(err)
		}
		moves, err := step.ParseMoves("1,2,2,ttl,wait,1", 2)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range moves[:5] {
			if err := run.Advance(t.Context(), m); err != nil {
				t.Fatalf("move %d (%s): %v", i+1, m, err)
			}
			if i == 2 { // attempt 2 waits in the store; a second's bound would not end it in the bubble's 300 ms settle
				if a := stand(t, run, 2); a.State != step.StateBlocked {
					t.Fatalf("attempt 2 is %s, want blocked", a.State)
				}
			}
		}
		if a := stand(t, run, 2); a.State != step.StateAnswered || a.Answer.Status != 409 {
			t.Fatalf("after the wait move attempt 2 is %s (%+v), want answered 409", a.State, a.Answer)
		}
		if !slices.Equal(happened, []lab.TimeEvent{lab.EventTTL, lab.EventWait}) {
			t.Fatalf("events made to happen: %v", happened)
		}
		if err := run.Advance(t.Context(), moves[5]); err != nil {
			t.Fatal(err)
		}
		v := run.View()
		if !v.Over || overs != 1 || v.Verdict == nil || v.Checked != "linearizable" || len(v.Moves) != 6 {
			t.Fatalf("over %v, recorded %d times, verdict %+v, %d moves", v.Over, overs, v.Verdict, len(v.Moves))
		}
		if m := v.Moves[3]; m.Move.Event != lab.EventTTL || m.Did != "it happened" {
			t.Fatalf("the ttl move is recorded as %+v", m)
		}
		if st := v.Moves[0].Attempts; st[0].State != step.StatePaused || st[0].Point != lab.PointBeforeClaim || st[1].State != step.StateReady {
			t.Fatalf("after the first move the attempts stood %+v", st)
		}
	})
}

// TestSeededMoves: a seed draws moves among the attempts that can move
// until the run is over, and the same seed draws the same ones.
func TestSeededMoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		play := func(seed uint64) string {
			path := []lab.PausePoint{lab.PointBeforeClaim, lab.PointAfterClaim, lab.PointAfterCharge}
			_, run, _ := setup(t, time.Minute, script{points: path}, script{points: path}, script{points: path})
			if err := run.PlaySeed(t.Context(), seed); err != nil {
				t.Fatal(err)
			}
			if v := run.View(); !v.Over || len(v.Steps) != 12 {
				t.Fatalf("seed %d: over %v after %d moves", seed, v.Over, len(v.Steps))
			}
			return step.FormatMoves(run.View().Steps)
		}
		a, b, c := play(3), play(3), play(4)
		if a != b {
			t.Fatalf("seed 3 drew %s, then %s", a, b)
		}
		if a == c {
			t.Logf("seeds 3 and 4 drew the same moves: %s", a)
		}
	})
}
