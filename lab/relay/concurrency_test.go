package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/relay"
)

// gathering holds every delivery until width of them are in flight at once,
// then lets them all through to the real provider: it answers only if the
// relay truly delivers a batch concurrently.
type gathering struct {
	relay.Receiver
	width int

	mu      sync.Mutex
	waiting int
	all     chan struct{}
	peak    int
}

func (g *gathering) Deliver(ctx context.Context, e lab.Event) (bool, error) {
	g.mu.Lock()
	g.waiting++
	g.peak = max(g.peak, g.waiting)
	if g.waiting == g.width {
		close(g.all)
	}
	g.mu.Unlock()
	select {
	case <-g.all:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return g.Receiver.Deliver(ctx, e)
}

// TestABatchIsDeliveredConcurrently: one worker's batch of eight events is
// delivered eight at once (the provider answers none until all eight are in
// flight), each completed under its own claim: every event delivered once,
// every capture and receipt recorded once, nothing fenced.
func TestABatchIsDeliveredConcurrently(t *testing.T) {
	t.Parallel()
	all, c := setup(t)
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			recv := newReceiver(t, b)
			for i := range 8 {
				chargeCents(t, b, c, fmt.Sprintf("k-%s-%d", name, i), 100)
			}
			g := &gathering{Receiver: recv, width: 8, all: make(chan struct{})}
			cfg := relay.Defaults()
			cfg.Concurrency = 8
			r := newRelayWith(t, b, g, c, cfg)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			n, err := r.Tick(ctx)
			if err != nil || n != 8 {
				t.Fatalf("one tick delivered %d (peak %d in flight): %v", n, g.peak, err)
			}
			st, err := b.OutboxStats(t.Context(), "")
			if err != nil || st.Pending != 0 || st.Delivered < 8 {
				t.Fatalf("outbox after the tick: %+v %v", st, err)
			}
			if unique, deliveries, err := recv.receipts(t.Context(), "run-relay"); err != nil || unique != 8 || deliveries != 8 {
				t.Errorf("receipts %d from %d deliveries (%v), want 8 from 8", unique, deliveries, err)
			}
			if r.Counts().Fenced != 0 || r.Counts().Delivered != 8 {
				t.Errorf("counts %+v", r.Counts())
			}
		})
	}
}
