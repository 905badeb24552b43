// Package relay delivers outbox events to the provider at least once:
// claim due events under a lease, deliver, mark delivered, or back off with
// jitter and retry; events that exhaust their attempts stay visible as dead.
package relay

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Relay moves events from the outbox to the provider.
type Relay struct {
	Outbox      lab.Outbox
	Provider    lab.Provider
	Interval    time.Duration // poll interval; default 100ms
	Lease       time.Duration // how long a claimed event is hidden from other relays; default 10s
	Batch       int           // events per tick; default 50
	MaxAttempts int           // then the event is dead; default 8
	BaseBackoff time.Duration // first retry delay, doubled per attempt with jitter; default 500ms
	Logger      *slog.Logger
}

func (r *Relay) defaults() {
	if r.Interval <= 0 {
		r.Interval = 100 * time.Millisecond
	}
	if r.Lease <= 0 {
		r.Lease = 10 * time.Second
	}
	if r.Batch <= 0 {
		r.Batch = 50
	}
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = 8
	}
	if r.BaseBackoff <= 0 {
		r.BaseBackoff = 500 * time.Millisecond
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
}

// Run delivers until ctx is cancelled.
func (r *Relay) Run(ctx context.Context) {
	r.defaults()
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		if _, err := r.Tick(ctx); err != nil && ctx.Err() == nil {
			r.Logger.WarnContext(ctx, "outbox relay tick failed", "err", err)
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
	r.defaults()
	events, err := r.Outbox.ClaimDue(ctx, r.Batch, r.Lease)
	if err != nil {
		return 0, fmt.Errorf("error claiming outbox events: %w", err)
	}
	delivered := 0
	for _, ev := range events {
		if _, err := r.Provider.Deliver(ctx, ev, false); err != nil {
			dead := ev.Attempts >= r.MaxAttempts
			if merr := r.Outbox.MarkFailed(ctx, ev.ID, time.Now().Add(r.backoff(ev.Attempts)), dead, err.Error()); merr != nil {
				return delivered, fmt.Errorf("error recording failed delivery: %w", merr)
			}
			continue
		}
		if err := r.Outbox.MarkDelivered(ctx, ev.ID); err != nil {
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
	d := r.BaseBackoff << min(attempts-1, 16)
	d = min(d, time.Minute)
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}
