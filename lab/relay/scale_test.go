package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/relay"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

// TestWorkersFollowTheBacklog: one worker finds a backlog of 24 full
// batches; every two full claims in a row start another worker, up to
// MaxWorkers, and once the outbox is empty the extra workers stop, back
// to Workers. However many workers there were, every event was delivered
// once, never twice at once, and the provider applied exactly one capture
// per charge.
func TestWorkersFollowTheBacklog(t *testing.T) {
	t.Parallel()
	all, c := setup(t)
	const events, batch = 120, 5
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			rcv := newReceiver(t, b)
			for i := range events {
				charge(t, b, c, fmt.Sprintf("k-scale-%s-%d", name, i))
			}
			rec := newCounting(rcv)
			cfg := relay.Defaults()
			cfg.Interval, cfg.Batch, cfg.Concurrency, cfg.Workers, cfg.MaxWorkers = time.Millisecond, batch, 2, 1, 4
			cfg.Signals.Ticked = testsignal.New()
			r := newRelayWith(t, b, rec, c, cfg)
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			wg.Go(func() { r.Run(ctx) })
			defer func() {
				cancel()
				wg.Wait()
				if n := r.Counts().Workers; n != 0 {
					t.Errorf("%d workers still counted after Run returned", n)
				}
			}()

			cfg.Signals.Ticked.WaitUntil(t, "the outbox drained", func() bool {
				s, err := b.OutboxStats(t.Context(), "")
				return err == nil && s.Delivered == events
			})
			// Every claim but the last found a full batch: far more full
			// claims in a row than it takes to reach the most workers.
			if got := r.Counts().MostWorkers; got != int64(cfg.MaxWorkers) {
				t.Errorf("at most %d workers ran under a backlog of %d batches; want %d", got, events/batch, cfg.MaxWorkers)
			}
			// The outbox reads delivered a moment before the relay counts it.
			cfg.Signals.Ticked.WaitUntil(t, "the idle workers stopping", func() bool {
				got := r.Counts()
				return got.Workers == int64(cfg.Workers) && got.Delivered == events
			})

			rec.eachOnce(t, events)
			if got := r.Counts(); got.Delivered != events || got.Fenced != 0 || got.Failed != 0 {
				t.Fatalf("counts %+v; want %d delivered, nothing fenced or failed", got, events)
			}
			s, err := rcv.records.Stats(t.Context(), provider.Filter{Run: "run-relay"})
			if err != nil {
				t.Fatal(err)
			}
			if s.CapturesApplied != events || s.CaptureRequests != events || s.ChargesCapturedTwice != 0 || s.Receipts != events {
				t.Fatalf("provider %+v; want one capture per charge, one request each, and one receipt each", s)
			}
		})
	}
}
