// Package relay delivers outbox events to the provider at least once:
// claim due events under a lease, deliver, mark delivered, or back off with
// jitter and retry; events that exhaust their attempts stay visible as dead.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Outbox is where the relay finds due events and records what became of them.
type Outbox interface {
	// ClaimDue leases up to limit due pending events for lease.
	ClaimDue(ctx context.Context, limit int, lease time.Duration) ([]lab.Event, error)
	MarkDelivered(ctx context.Context, id string) error
	MarkFailed(ctx context.Context, id string, next time.Time, dead bool, reason string) error
}

// Provider receives events; it deduplicates by event id, as a well-behaved
// downstream does, and reports whether a delivery was a duplicate.
type Provider interface {
	Deliver(ctx context.Context, e lab.Event) (duplicate bool, err error)
}

// Config configures a Relay. Every field is required.
type Config struct {
	Outbox      Outbox
	Provider    Provider
	Clock       lab.Clock
	Logger      *slog.Logger
	Interval    time.Duration // poll interval
	Lease       time.Duration // how long a claimed event is hidden from other relays
	Batch       int           // events per tick
	MaxAttempts int           // then the event is dead
	BaseBackoff time.Duration // first retry delay, doubled per attempt with jitter, capped at a minute
}

// Defaults are the settings the lab runs with.
func Defaults() Config {
	return Config{
		Interval: 100 * time.Millisecond, Lease: 10 * time.Second, Batch: 50,
		MaxAttempts: 8, BaseBackoff: 500 * time.Millisecond,
	}
}

// Relay moves events from the outbox to the provider. Its settings are fixed
// at construction, so Tick and Run may overlap.
type Relay struct {
	cfg Config
}

// New checks cfg and returns a relay.
func New(cfg Config) (*Relay, error) {
	switch {
	case cfg.Outbox == nil || cfg.Provider == nil || cfg.Clock == nil || cfg.Logger == nil:
		return nil, errors.New("relay: outbox, provider, clock and logger are required")
	case cfg.Interval <= 0 || cfg.Lease <= 0 || cfg.BaseBackoff <= 0:
		return nil, fmt.Errorf("relay: interval, lease and backoff must be positive (got %s, %s, %s)", cfg.Interval, cfg.Lease, cfg.BaseBackoff)
	case cfg.Batch < 1 || cfg.MaxAttempts < 1:
		return nil, fmt.Errorf("relay: batch and max attempts must be at least 1 (got %d, %d)", cfg.Batch, cfg.MaxAttempts)
	}
	return &Relay{cfg: cfg}, nil
}

// Run delivers until ctx is cancelled.
func (r *Relay) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := r.Tick(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.WarnContext(ctx, "outbox relay tick failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Tick delivers one batch of due events and reports how many were delivered.
func (r *Relay) Tick(ctx context.Context) (int, error) {
	events, err := r.cfg.Outbox.ClaimDue(ctx, r.cfg.Batch, r.cfg.Lease)
	if err != nil {
		return 0, fmt.Errorf("error claiming outbox events: %w", err)
	}
	delivered := 0
	for _, ev := range events {
		if _, err := r.cfg.Provider.Deliver(ctx, ev); err != nil {
			dead := ev.Attempts >= r.cfg.MaxAttempts
			next := r.cfg.Clock().Add(r.backoff(ev.Attempts))
			if merr := r.cfg.Outbox.MarkFailed(ctx, ev.ID, next, dead, err.Error()); merr != nil {
				return delivered, fmt.Errorf("error recording failed delivery: %w", merr)
			}
			continue
		}
		if err := r.cfg.Outbox.MarkDelivered(ctx, ev.ID); err != nil {
			// The provider has it; the event stays pending and will be
			// delivered again, which the provider deduplicates by event id.
			return delivered, fmt.Errorf("error marking event delivered: %w", err)
		}
		delivered++
	}
	return delivered, nil
}

// backoff doubles per attempt, capped at one minute, with ±20% jitter.
func (r *Relay) backoff(attempts int) time.Duration {
	d := r.cfg.BaseBackoff << min(max(attempts-1, 0), 16)
	d = min(d, time.Minute)
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}
