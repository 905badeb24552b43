package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/relay"
	"github.com/idempotency-lab/lab/lab/testsignal"
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

// withholding holds the delivery of one event until released, as a
// provider that withholds its answer does; every other passes.
type withholding struct {
	relay.Receiver
	charge  string
	held    chan struct{} // closed when the held delivery has started
	release chan struct{}
	once    sync.Once
}

func (w *withholding) Deliver(ctx context.Context, e lab.Event) (bool, error) {
	if e.ChargeID == w.charge {
		w.once.Do(func() { close(w.held) })
		select {
		case <-w.release:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return w.Receiver.Deliver(ctx, e)
}

// TestAWithheldDeliveryHoldsOnlyItsSlot: while a worker's delivery waits
// on a provider that withholds its answer, the events charged after it are
// claimed and delivered by the same worker: it claims again once its batch
// has started, not once every delivery of it has ended. Then the withheld
// one is delivered too, each event once.
func TestAWithheldDeliveryHoldsOnlyItsSlot(t *testing.T) {
	t.Parallel()
	c := labtest.NewClock(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := inmem.NewBooks(c.Now)
	recv := newReceiver(t, b)
	slow := chargeCents(t, b, c, "k-withheld", 100)
	w := &withholding{Receiver: recv, charge: slow.ChargeID, held: make(chan struct{}), release: make(chan struct{})}
	cfg := relay.Defaults()
	cfg.Workers, cfg.MaxWorkers, cfg.Interval = 1, 1, 5*time.Millisecond
	cfg.Signals.Ticked = testsignal.New()
	r := newRelayWith(t, b, w, c, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		r.Run(ctx)
	}()
	defer func() { cancel(); <-stopped }()
	<-w.held
	for i := range 5 {
		chargeCents(t, b, c, fmt.Sprintf("k-after-%d", i), 100)
	}
	cfg.Signals.Ticked.WaitUntil(t, "the five charged after delivered beside the withheld one", func() bool {
		return r.Counts().Delivered == 5
	})
	close(w.release)
	cfg.Signals.Ticked.WaitUntil(t, "the withheld one delivered", func() bool { return r.Counts().Delivered == 6 })
	if unique, deliveries, err := recv.receipts(t.Context(), "run-relay"); err != nil || unique != 6 || deliveries != 6 {
		t.Errorf("receipts %d from %d deliveries (%v), want 6 from 6", unique, deliveries, err)
	}
}
