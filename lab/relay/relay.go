// Package relay delivers outbox events to the provider at least once:
// workers claim due events under a lease and a random claim token, deliver,
// then complete the event (delivered, or backed off with jitter) fenced by
// that token; events that exhaust their attempts stay visible as dead.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

// Outbox is where the relay finds due events and records what became of them.
type Outbox interface {
	// ClaimDue leases up to limit due pending events for lease to one new
	// claim: each comes back with one more attempt and the claim's token.
	ClaimDue(ctx context.Context, limit int, lease time.Duration) ([]lab.Event, error)
	// MarkDelivered and MarkFailed complete an event the claim token still
	// holds; when another claim superseded it, or the event is no longer
	// pending, they change nothing and return an error wrapping
	// lab.ErrFenced.
	MarkDelivered(ctx context.Context, id, token string) error
	MarkFailed(ctx context.Context, id, token string, next time.Time, dead bool, reason string) error
}

// Receiver receives events; it deduplicates by event id, as a well-behaved
// downstream does, and reports whether a delivery was a duplicate.
type Receiver interface {
	Deliver(ctx context.Context, e lab.Event) (duplicate bool, err error)
}

// Settings tune a relay; every field is required (Defaults has the lab's)
// but Signals.
type Settings struct {
	Interval time.Duration // poll interval of each worker
	Lease    time.Duration // how long a claimed event is hidden from other workers
	Batch    int           // events per claim
	// Workers are the goroutines of one relay, each claiming its own
	// batch, at least; MaxWorkers at most. A worker whose claims come back
	// full (more were due than it took) starts another, up to MaxWorkers;
	// one above Workers whose claim comes back empty stops: the relay
	// holds connections and goroutines for the backlog it has, not for the
	// largest it ever had.
	Workers    int
	MaxWorkers int
	// Concurrency bounds one worker's deliveries in flight at once: a
	// delivery waits mostly on the provider (its capture, then its webhooks
	// back), so one at a time leaves the relay far behind the charges.
	Concurrency int
	MaxAttempts int           // then the event is dead
	BaseBackoff time.Duration // first retry delay, doubled per attempt, with jitter
	MaxBackoff  time.Duration // cap of the retry delay
	// Signals are what a test waits on; the zero value signals nothing.
	// They are settings so that a test of a whole lab can pass them in.
	Signals Signals
}

// Validate reports settings out of range.
func (s Settings) Validate() error {
	switch {
	case s.Interval <= 0 || s.Lease <= 0 || s.BaseBackoff <= 0:
		return fmt.Errorf("relay: interval, lease and backoff must be positive (got %s, %s, %s)", s.Interval, s.Lease, s.BaseBackoff)
	case s.MaxBackoff < s.BaseBackoff:
		return fmt.Errorf("relay: max backoff %s is below the base backoff %s", s.MaxBackoff, s.BaseBackoff)
	case s.Batch < 1 || s.MaxAttempts < 1 || s.Workers < 1 || s.Concurrency < 1:
		return fmt.Errorf("relay: batch, max attempts, workers and concurrency must be at least 1 (got %d, %d, %d, %d)",
			s.Batch, s.MaxAttempts, s.Workers, s.Concurrency)
	case s.MaxWorkers < s.Workers:
		return fmt.Errorf("relay: max workers %d is below the workers %d", s.MaxWorkers, s.Workers)
	}
	return nil
}

// Config configures a Relay. Every field is required.
type Config struct {
	Outbox   Outbox
	Provider Receiver
	Clock    lab.Clock
	Logger   *slog.Logger
	Settings
}

// Signals are the points of a relay a test can wait on, instead of
// sleeping (see lab/testsignal).
type Signals struct {
	// Ticked: a worker's turn is over, its batch handed to its
	// deliveries, or skipped while the relay is held; and a worker's
	// delivery is recorded.
	Ticked testsignal.Signal
}

// Defaults are the settings the lab runs with.
func Defaults() Config {
	return Config{Settings: Settings{
		Interval: 100 * time.Millisecond, Lease: 10 * time.Second, Batch: 50, Workers: 2, MaxWorkers: 8, Concurrency: 8,
		MaxAttempts: 8, BaseBackoff: 500 * time.Millisecond, MaxBackoff: time.Minute,
	}}
}

// Relay moves events from the outbox to the provider. Its settings are fixed
// at construction, so Tick and Run may overlap, and several relays may share
// one outbox.
type Relay struct {
	cfg                     Config
	delivered, failed, dead atomic.Int64
	fenced                  atomic.Int64
	workers, mostWorkers    atomic.Int64
	held                    atomic.Bool
}

// New checks cfg and returns a relay.
func New(cfg Config) (*Relay, error) {
	if cfg.Outbox == nil || cfg.Provider == nil || cfg.Clock == nil || cfg.Logger == nil {
		return nil, errors.New("relay: outbox, provider, clock and logger are required")
	}
	if err := cfg.Settings.Validate(); err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg}, nil
}

// Fenced counts the completions the outbox refused because the worker's
// claim had been superseded: deliveries another worker repeated.
func (r *Relay) Fenced() int64 { return r.fenced.Load() }

// Counts are a relay's delivery attempts by outcome.
type Counts struct {
	Delivered int64 // delivered and completed
	Failed    int64 // failed, to be tried again
	Dead      int64 // failed for the last time
	Fenced    int64 // completions refused: the claim was superseded
	// Workers are the workers running now, MostWorkers the most that
	// ever ran at once: the backlog adds them, idleness takes them away.
	Workers     int64
	MostWorkers int64
}

// Counts reports the relay's delivery attempts so far, by outcome, and its
// workers.
func (r *Relay) Counts() Counts {
	return Counts{Delivered: r.delivered.Load(), Failed: r.failed.Load(), Dead: r.dead.Load(), Fenced: r.fenced.Load(),
		Workers: r.workers.Load(), MostWorkers: r.mostWorkers.Load()}
}

// Hold stops (true) or resumes (false) the workers' ticks: held, events
// wait in the outbox. A benchmark holds delivery to measure the charge path
// alone, then times how fast the relay drains what it left.
func (r *Relay) Hold(held bool) { r.held.Store(held) }

// growAfter is how many full claims in a row make a worker start another:
// one full claim may be a burst the next claim empties.
const growAfter = 2

// Run delivers until ctx is cancelled, with Workers workers and, while the
// backlog lasts, more of them up to MaxWorkers.
func (r *Relay) Run(ctx context.Context) {
	c := &crew{r: r}
	for range r.cfg.Workers {
		c.grow(ctx)
	}
	c.wg.Wait()
}

// crew is one Run's workers.
type crew struct {
	r  *Relay
	wg sync.WaitGroup
	mu sync.Mutex
	n  int // workers running, guarded by mu
}

// grow starts one more worker unless MaxWorkers run already.
func (c *crew) grow(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n >= c.r.cfg.MaxWorkers {
		return
	}
	c.n++
	raise(&c.r.mostWorkers, c.r.workers.Add(1))
	c.wg.Go(func() { c.r.work(ctx, c) })
}

// raise sets v to n if n is larger.
func raise(v *atomic.Int64, n int64) {
	for old := v.Load(); n > old; old = v.Load() {
		if v.CompareAndSwap(old, n) {
			return
		}
	}
}

// shrink lets an idle worker stop, and reports whether it may: never below
// Workers, and always when the relay stops.
func (c *crew) shrink(stopping bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !stopping && c.n <= c.r.cfg.Workers {
		return false
	}
	c.n--
	c.r.workers.Add(-1)
	return true
}

// work is one worker: a claim, its deliveries handed to the worker's
// Concurrency slots, then the next claim at once when this one was full,
// or after the next tick. The next claim does not wait for the last
// deliveries of this one: a provider that withholds its answer holds one
// slot for its timeout, not every event behind it.
func (r *Relay) work(ctx context.Context, c *crew) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	slots := make(chan struct{}, r.cfg.Concurrency)
	var inFlight sync.WaitGroup
	defer inFlight.Wait() // a stopping worker's deliveries end before it does
	done := func(_ bool, err error) {
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.WarnContext(ctx, "outbox delivery failed", "err", err)
		}
		r.cfg.Signals.Ticked.Signal()
	}
	full := 0 // full claims in a row
	for {
		claimed := 0
		if !r.held.Load() {
			var err error
			if claimed, err = r.dispatch(ctx, slots, &inFlight, done); err != nil && ctx.Err() == nil {
				r.cfg.Logger.WarnContext(ctx, "outbox relay tick failed", "err", err)
			}
		}
		if claimed < r.cfg.Batch {
			full = 0
		} else if full++; full == growAfter {
			full = 0
			c.grow(ctx)
		}
		if claimed == 0 && ctx.Err() == nil && c.shrink(false) {
			r.cfg.Signals.Ticked.Signal()
			return
		}
		r.cfg.Signals.Ticked.Signal()
		if claimed == r.cfg.Batch && ctx.Err() == nil {
			continue // more were due than it took: no wait for the tick
		}
		select {
		case <-ctx.Done():
			c.shrink(true)
			return
		case <-t.C:
		}
	}
}

// Tick claims one batch of due events, delivers them, up to Concurrency at
// once, and reports how many were delivered and completed. Each delivery is
// completed under its own claim token, so running them together changes no
// guarantee: a completion the fence refuses is logged and counted (Fenced),
// never counted as delivered, and an event whose completion failed stays
// pending until its lease ends.
func (r *Relay) Tick(ctx context.Context) (int, error) {
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		delivered int
		errs      []error
	)
	_, err := r.dispatch(ctx, make(chan struct{}, r.cfg.Concurrency), &wg, func(ok bool, err error) {
		mu.Lock()
		defer mu.Unlock()
		if ok {
			delivered++
		}
		if err != nil {
			errs = append(errs, err)
		}
	})
	wg.Wait()
	return delivered, errors.Join(append(errs, err)...)
}

// dispatch claims one batch of due events and starts each one's delivery
// as a slot frees, reporting each to done; it returns once every event has
// started, with how many it claimed.
func (r *Relay) dispatch(ctx context.Context, slots chan struct{}, wg *sync.WaitGroup, done func(delivered bool, err error)) (int, error) {
	events, err := r.cfg.Outbox.ClaimDue(ctx, r.cfg.Batch, r.cfg.Lease)
	if err != nil {
		return 0, fmt.Errorf("error claiming outbox events: %w", err)
	}
	for _, ev := range events {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			// Stopping: the events not started stay claimed until their
			// lease ends, then are delivered again.
			return len(events), ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-slots }()
			done(r.deliver(ctx, ev))
		})
	}
	return len(events), nil
}

// deliver sends one claimed event and completes it under the claim's fence.
func (r *Relay) deliver(ctx context.Context, ev lab.Event) (bool, error) {
	_, derr := r.cfg.Provider.Deliver(ctx, ev)
	var err error
	if derr != nil {
		dead := ev.Attempts >= r.cfg.MaxAttempts
		next := r.cfg.Clock().Add(r.backoff(ev.Attempts))
		err = r.cfg.Outbox.MarkFailed(ctx, ev.ID, ev.ClaimToken, next, dead, derr.Error())
	} else {
		err = r.cfg.Outbox.MarkDelivered(ctx, ev.ID, ev.ClaimToken)
	}
	switch {
	case errors.Is(err, lab.ErrFenced):
		r.fenced.Add(1)
		r.cfg.Logger.WarnContext(ctx, "outbox completion refused: the claim was superseded",
			"event_id", ev.ID, "attempt", ev.Attempts, "delivered", derr == nil)
		return false, nil
	case err != nil && derr != nil:
		return false, fmt.Errorf("error recording failed delivery: %w", err)
	case err != nil:
		// The provider has it; the event stays pending and will be
		// delivered again when the lease ends, which the provider
		// deduplicates by event id.
		return false, fmt.Errorf("error marking event delivered: %w", err)
	case derr == nil:
		r.delivered.Add(1)
	case ev.Attempts >= r.cfg.MaxAttempts:
		r.dead.Add(1)
	default:
		r.failed.Add(1)
	}
	return derr == nil, nil
}

// backoff doubles per attempt from the base, capped, minus up to 20% of
// jitter so that failures that happened together do not retry together.
func (r *Relay) backoff(attempts int) time.Duration {
	d := min(r.cfg.BaseBackoff<<min(max(attempts-1, 0), 20), r.cfg.MaxBackoff)
	if d <= 0 { // the shift overflowed
		d = r.cfg.MaxBackoff
	}
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}
