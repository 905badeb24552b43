package lab

import (
	"context"
	"fmt"
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
	PointAfterProviderCall    PausePoint = "after_provider_call"    // phases: the provider's capture is recorded (recovery point provider_called)
	PointAfterFinish          PausePoint = "after_finish"           // phases: the key is finished, its response not yet sent
)

// StepGate holds one attempt of a stepped run at its pause points.
type StepGate interface {
	// Reach reports that the attempt stands at p and returns when it is
	// its turn to move on, or with an error when ctx ends or the stepped
	// run is aborted first.
	Reach(ctx context.Context, p PausePoint) error
	// Name is "<run id>/<attempt>": a store tags what it holds with it, so
	// the stepper can say who holds what and act on it.
	Name() string
	// WaitEnds is closed when a move ends the lab's bounded waits for the
	// attempt (the "wait" event): a wait of its own then runs out at once.
	WaitEnds() <-chan struct{}
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

// StepName is the stepped attempt's "<run id>/<attempt>", "" for any other.
func StepName(ctx context.Context) string {
	if g, ok := ctx.Value(stepGateKey{}).(StepGate); ok {
		return g.Name()
	}
	return ""
}

// StepWait bounds a store's own waits (for an in-flight twin, for a row
// lock) in a stepped run: as long as the run may stay idle, so that the
// schedule, not a timer racing it, decides when an attempt moves on.
const StepWait = 2 * time.Minute

// BoundedWait is the bound a store puts on a wait of its own: d, or
// StepWait for an attempt of a stepped run (whose "wait" move ends it
// sooner: see WaitBound).
func BoundedWait(ctx context.Context, d time.Duration) time.Duration {
	if Stepped(ctx) {
		return StepWait
	}
	return d
}

// WaitBound is a store's bounded wait as a context: done after d, or, in a
// stepped run, when a "wait" move ends it (or after StepWait). The store
// tells it from its caller's end by ctx.Err(): nil means the bound ran out.
func WaitBound(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	g, ok := ctx.Value(stepGateKey{}).(StepGate)
	if !ok {
		return context.WithTimeout(ctx, d)
	}
	wctx, cancel := context.WithTimeout(ctx, StepWait)
	go func() { // ends with wctx, which cancel ends
		select {
		case <-g.WaitEnds():
			cancel()
		case <-wctx.Done():
		}
	}()
	return wctx, cancel
}

// TimeEvent is something time makes happen to a key, which a stepped run
// makes happen at one step instead, on the real store: no timer decides.
type TimeEvent string

// The time-driven moves of a stepped run.
const (
	EventTTL      TimeEvent = "ttl"      // the claim's TTL runs out (redis)
	EventLease    TimeEvent = "lease"    // the claim's lease ends (lease)
	EventWindow   TimeEvent = "window"   // the retention window passes: the key is forgotten
	EventFailover TimeEvent = "failover" // Redis fails over: the replica, which never saw the claim, is promoted
	// EventPGFailover: PostgreSQL fails over: the standby, which received
	// nothing since the run began, is promoted and the old primary fenced.
	EventPGFailover TimeEvent = "pg_failover"
	EventWait       TimeEvent = "wait" // the lab's bounded waits end: an in-flight wait, a lock timeout
	EventLock       TimeEvent = "lock" // the key's lock ends (phases): a retry may take it over
	// EventCompleter: the completer's turn comes for the key (phases): its
	// lock ends, and the completer takes it over and finishes it.
	EventCompleter TimeEvent = "completer"
)

// TimeEvents lists the time-driven moves with what each one means.
func TimeEvents() []TimeEventSpec {
	return []TimeEventSpec{
		{EventTTL, "the claim's TTL runs out"},
		{EventLease, "the claim's lease ends (a paused worker renews nothing)"},
		{EventWindow, "the retention window passes: the key is forgotten"},
		{EventFailover, "Redis fails over before the claim replicated (needs fault=failover)"},
		{EventPGFailover, "PostgreSQL fails over before the commit replicated (needs fault=pg_failover)"},
		{EventWait, "the lab's bounded waits end: a blocked twin gives up (409)"},
		{EventLock, "the key's lock ends (phases): the next attempt takes it over and resumes from its recovery point"},
		{EventCompleter, "the completer finishes the key from its recovery point (phases), its lock ended"},
	}
}

// TimeEventSpec is one time-driven move; a design it means nothing to refuses it.
type TimeEventSpec struct {
	Event TimeEvent `json:"name"`
	Title string    `json:"title"`
}

// TimeMover makes a time-driven event happen now to one key, on the real
// store. A design without such a thing answers an InvalidError.
type TimeMover interface {
	MakeHappen(ctx context.Context, sc Scope, e TimeEvent) error
	// TimeMoves are the events the design has.
	TimeMoves() []TimeEvent
}

// KeyInspector says what the store holds for one key right now, in-flight
// claims and uncommitted rows included, in a few lines a reader follows.
type KeyInspector interface {
	Inspect(ctx context.Context, sc Scope) (KeyInspection, error)
}

// KeyInspection is what a store holds for one key, for a stepped run's view.
type KeyInspection struct {
	Where string   `json:"where"` // the store and where it keeps the key
	State string   `json:"state"` // in_flight, completed, unsettled, absent
	Facts []string `json:"facts"` // "TTL 59.2 s left", "row locked by attempt 1"
	// Blocked says, by attempt number, what the store sees an attempt
	// wait on, when it can see it (a lock wait).
	Blocked map[string]string `json:"blocked,omitempty"`
	// Shared says the key lives outside the replica (a database, Redis):
	// every replica's store sees the same, so it is read once.
	Shared bool `json:"shared,omitempty"`
}

// Span is a duration as a reader of a key's state says it: "350 ms",
// "29.8 s", "4 m 10 s", "23 h 59 m".
func Span(d time.Duration) string {
	d = max(d, 0)
	if d < time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	d = d.Round(100 * time.Millisecond) // 59.97 s is "1 m 0 s", not "60.0 s"
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%d m %d s", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%d h %d m", int(d.Hours()), int(d.Minutes())%60)
}

// ShortFingerprint is a fingerprint's first 12 characters.
func ShortFingerprint(fp string) string {
	if len(fp) > 12 {
		return fp[:12] + "…"
	}
	return fp
}
