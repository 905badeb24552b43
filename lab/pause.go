package lab

import (
	"context"
	"time"
)

// PausePoint names a place on the charge path where an attempt of a stepped
// run stops and waits for its turn, so that an interleaving can be played
// move by move instead of being left to the scheduler.
type PausePoint string

// The pause points, in the order a first attempt passes them. A store
// pauses only at the points its design has.
const (
	PointBeforeClaim          PausePoint = "before_claim"           // nothing decided yet (look-first: before its look)
	PointAfterClaim           PausePoint = "after_claim"            // the attempt owns the key (look-first: it looked and found nothing)
	PointAfterWork            PausePoint = "after_work"             // the attempt's own work is done, nothing charged
	PointAfterCharge          PausePoint = "after_charge"           // the ledger holds the charge (uncommitted where a transaction holds both)
	PointBeforeResponseStored PausePoint = "before_response_stored" // the response is about to be stored under the key
	PointBeforeReplayRead     PausePoint = "before_replay_read"     // another attempt owns the key: its answer is about to be read
)

// StepGate holds one attempt of a stepped run at its pause points.
type StepGate interface {
	// Reach reports that the attempt stands at p and returns when it is
	// its turn to move on, or with an error when ctx ends or the stepped
	// run is aborted first.
	Reach(ctx context.Context, p PausePoint) error
}

type stepGateKey struct{}

// WithStepGate makes the attempt behind ctx a stepped one, held by g.
func WithStepGate(ctx context.Context, g StepGate) context.Context {
	return context.WithValue(ctx, stepGateKey{}, g)
}

// Stepped reports whether the attempt behind ctx belongs to a stepped run:
// its schedule, not a sleep, decides what overlaps.
func Stepped(ctx context.Context) bool {
	_, ok := ctx.Value(stepGateKey{}).(StepGate)
	return ok
}

// Pause stops a stepped attempt at p until its turn; any other attempt
// goes on at once, at the cost of one context lookup. An error means the
// attempt must give up (its client left, or the stepped run was aborted)
// and roll back what it holds.
func Pause(ctx context.Context, p PausePoint) error {
	g, ok := ctx.Value(stepGateKey{}).(StepGate)
	if !ok {
		return nil
	}
	return g.Reach(ctx, p)
}

// StepWait bounds a store's own waits (for an in-flight twin, for a row
// lock) in a stepped run: as long as the run may stay idle, so that the
// schedule, not a timer racing it, decides when an attempt moves on.
const StepWait = 2 * time.Minute

// BoundedWait is the bound a store puts on a wait of its own: d, or
// StepWait for an attempt of a stepped run.
func BoundedWait(ctx context.Context, d time.Duration) time.Duration {
	if Stepped(ctx) {
		return StepWait
	}
	return d
}
