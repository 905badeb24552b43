package lab_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// gateFunc is a StepGate made of a function.
type gateFunc func(ctx context.Context, p lab.PausePoint) error

func (f gateFunc) Reach(ctx context.Context, p lab.PausePoint) error { return f(ctx, p) }
func (f gateFunc) Name() string                                      { return "step-test/1" }
func (f gateFunc) WaitEnds() <-chan struct{}                         { return nil }

func TestPause(t *testing.T) {
	t.Run("Unstepped", func(t *testing.T) {
		if err := lab.Pause(t.Context(), lab.PointAfterClaim); err != nil || lab.Stepped(t.Context()) {
			t.Fatalf("an attempt without a gate paused: err=%v stepped=%v", err, lab.Stepped(t.Context()))
		}
	})
	t.Run("Stepped", func(t *testing.T) {
		var reached []lab.PausePoint
		stop := errors.New("aborted")
		ctx := lab.WithStepGate(t.Context(), gateFunc(func(_ context.Context, p lab.PausePoint) error {
			reached = append(reached, p)
			if p == lab.PointAfterCharge {
				return stop
			}
			return nil
		}))
		if !lab.Stepped(ctx) {
			t.Fatal("a context with a gate is not stepped")
		}
		if err := lab.Pause(ctx, lab.PointBeforeClaim); err != nil {
			t.Fatal(err)
		}
		if err := lab.Pause(ctx, lab.PointAfterCharge); !errors.Is(err, stop) {
			t.Fatalf("the gate's error was lost: %v", err)
		}
		if len(reached) != 2 || reached[0] != lab.PointBeforeClaim || reached[1] != lab.PointAfterCharge {
			t.Fatalf("reached %v", reached)
		}
	})
}

// BenchmarkPauseUnstepped is what every pause point costs a charge that is
// not stepped: one context lookup.
func BenchmarkPauseUnstepped(b *testing.B) {
	ctx := lab.WithPhases(context.Background(), lab.NewPhases(time.Now())) // a request's context carries a value or two
	for b.Loop() {
		if err := lab.Pause(ctx, lab.PointAfterClaim); err != nil {
			b.Fatal(err)
		}
	}
}
