package labtest

import (
	"context"
	"testing"

	"github.com/idempotency-lab/lab/lab"
)

// StepGate holds one stepped attempt for a store's test (lab.StepGate):
// each point it reaches is reported, and it moves on when the test says so.
type StepGate struct {
	name     string
	reached  chan lab.PausePoint
	turn     chan struct{}
	waitEnds chan struct{}
}

// NewStepGate is a gate for the attempt named name ("<run>/<attempt>").
func NewStepGate(name string) *StepGate {
	return &StepGate{name: name, reached: make(chan lab.PausePoint, 8), turn: make(chan struct{}), waitEnds: make(chan struct{})}
}

// Reach reports p and waits for the test's Move.
func (g *StepGate) Reach(ctx context.Context, p lab.PausePoint) error {
	g.reached <- p
	select {
	case <-g.turn:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Name is the attempt's name.
func (g *StepGate) Name() string { return g.name }

// WaitEnds is closed by EndWaits.
func (g *StepGate) WaitEnds() <-chan struct{} { return g.waitEnds }

// EndWaits is the "wait" move: the attempt's bounded waits end now.
func (g *StepGate) EndWaits() { close(g.waitEnds) }

// At waits until the attempt stands at want.
func (g *StepGate) At(t *testing.T, want lab.PausePoint) {
	t.Helper()
	if got := <-g.reached; got != want {
		t.Fatalf("%s reached %s, want %s", g.name, got, want)
	}
}

// Move lets the attempt go on from where it stands.
func (g *StepGate) Move() { g.turn <- struct{}{} }
