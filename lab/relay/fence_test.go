package relay_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/relay"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

// counting passes deliveries to the provider and records, per event id, how
// many it made and whether two of them were ever in flight at once.
type counting struct {
	relay.Receiver
	mu         sync.Mutex
	deliveries map[string]int
	inFlight   map[string]int
	overlaps   int
}

func newCounting(p relay.Receiver) *counting {
	return &counting{Receiver: p, deliveries: map[string]int{}, inFlight: map[string]int{}}
}

func (p *counting) Deliver(ctx context.Context, e lab.Event) (bool, error) {
	p.mu.Lock()
	p.deliveries[e.ID]++
	p.inFlight[e.ID]++
	if p.inFlight[e.ID] > 1 {
		p.overlaps++
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inFlight[e.ID]--
		p.mu.Unlock()
	}()
	// A delivery gives the other workers their turn, as a real one waiting
	// on the network does: the window in which a second worker, were the
	// claim not fenced, would overlap it (widened by yields, not by time).
	for range 20 {
		runtime.Gosched()
	}
	return p.Receiver.Deliver(ctx, e)
}

// eachOnce fails the test unless events distinct events were delivered,
// each once, never two deliveries of one in flight together.
func (p *counting) eachOnce(t *testing.T, events int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, n := range p.deliveries {
		if n != 1 {
			t.Errorf("event %s delivered %d times", id, n)
		}
	}
	if p.overlaps != 0 || len(p.deliveries) != events {
		t.Fatalf("%d overlapping deliveries, %d events delivered; want 0 and %d", p.overlaps, len(p.deliveries), events)
	}
}

func (p *counting) count(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deliveries[id]
}

// stalling delivers, then hangs until released: a worker killed (or
// paused) between the delivery and its completion.
type stalling struct {
	relay.Receiver
	delivered chan lab.Event
	release   chan struct{}
}

func (p *stalling) Deliver(ctx context.Context, e lab.Event) (bool, error) {
	dup, err := p.Receiver.Deliver(ctx, e)
	p.delivered <- e
	<-p.release
	return dup, err
}

// TestLateWorkerIsFenced: a worker whose lease expired while it hung after
// delivering finds the event re-claimed and delivered by another worker;
// its completion is refused and changes nothing.
func TestLateWorkerIsFenced(t *testing.T) {
	all, c := setup(t)
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			rcv := newReceiver(t, b)
			ctx := t.Context()
			ev := charge(t, b, c, "k-late")
			rec := newCounting(rcv)
			stall := &stalling{Receiver: rec, delivered: make(chan lab.Event, 1), release: make(chan struct{})}
			late, other := newRelay(t, b, stall, c, 8), newRelay(t, b, rec, c, 8)

			type result struct {
				n   int
				err error
			}
			done := make(chan result, 1)
			go func() {
				n, err := late.Tick(ctx)
				done <- result{n, err}
			}()
			held := testsignal.Receive(t, "the late worker's delivery", stall.delivered)
			if held.ClaimToken == "" || held.Attempts != 1 {
				t.Fatalf("claimed %+v: want a claim token on the first attempt", held)
			}

			c.Advance(relay.Defaults().Lease + time.Second) // the late worker's lease ends
			if n, err := other.Tick(ctx); n != 1 || err != nil {
				t.Fatalf("the other worker delivered %d (err %v), want 1", n, err)
			}
			after, _ := b.Events(ctx, "", 1)

			close(stall.release) // the late worker wakes up and completes
			if r := testsignal.Receive(t, "the late worker completing", done); r.n != 0 || r.err != nil {
				t.Fatalf("late worker: delivered %d, err %v; want 0 and no error", r.n, r.err)
			}
			if late.Fenced() != 1 || other.Fenced() != 0 {
				t.Fatalf("fenced completions: late %d, other %d; want 1 and 0", late.Fenced(), other.Fenced())
			}
			// The fence answers the late worker's token directly too.
			if err := b.MarkDelivered(ctx, ev.ID, held.ClaimToken); !errors.Is(err, lab.ErrFenced) {
				t.Fatalf("late MarkDelivered: %v, want ErrFenced", err)
			}
			if err := b.MarkFailed(ctx, ev.ID, held.ClaimToken, c.Now(), true, "late"); !errors.Is(err, lab.ErrFenced) {
				t.Fatalf("late MarkFailed: %v, want ErrFenced", err)
			}
			evs, _ := b.Events(ctx, "", 1)
			if got := evs[0]; got.State != lab.EventDelivered || got.Attempts != 2 || got.LastError != "" ||
				!got.DeliveredAt.Equal(after[0].DeliveredAt) || got.NextAttempt != after[0].NextAttempt {
				t.Fatalf("event %+v after the late worker, want it as the other worker left it: %+v", got, after[0])
			}
			if n := rec.count(ev.ID); n != 2 {
				t.Fatalf("%d deliveries, want 2", n)
			}
			if unique, deliveries, _ := rcv.receipts(ctx, "run-relay"); unique != 1 || deliveries != 2 {
				t.Fatalf("receipts %d, deliveries %d; want 1 and 2", unique, deliveries)
			}
			// The redelivery was a replay at the provider: its capture key is derived from the charge.
			if applied, requests, _ := rcv.captures(ctx, "run-relay"); applied != 1 || requests != 2 {
				t.Fatalf("captures %d from %d requests; want 1 capture replayed once", applied, requests)
			}
		})
	}
}

// TestFenceRefusesSupersededClaim: while the second claim still holds the
// event, the first claim's token neither completes nor fails it.
func TestFenceRefusesSupersededClaim(t *testing.T) {
	all, c := setup(t)
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			charge(t, b, c, "k-fence")
			first, err := b.ClaimDue(ctx, 10, time.Second)
			if err != nil || len(first) != 1 || first[0].ClaimToken == "" {
				t.Fatalf("first claim %+v, err %v", first, err)
			}
			if again, _ := b.ClaimDue(ctx, 10, time.Second); len(again) != 0 {
				t.Fatalf("a leased event was claimed again: %+v", again)
			}
			c.Advance(2 * time.Second)
			second, err := b.ClaimDue(ctx, 10, time.Second)
			if err != nil || len(second) != 1 || second[0].ClaimToken == first[0].ClaimToken {
				t.Fatalf("second claim %+v, err %v: want the event under a new token", second, err)
			}
			id := first[0].ID
			if err := b.MarkFailed(ctx, id, first[0].ClaimToken, c.Now(), true, "late"); !errors.Is(err, lab.ErrFenced) {
				t.Fatalf("superseded MarkFailed: %v", err)
			}
			if err := b.MarkDelivered(ctx, id, first[0].ClaimToken); !errors.Is(err, lab.ErrFenced) {
				t.Fatalf("superseded MarkDelivered: %v", err)
			}
			if err := b.MarkDelivered(ctx, id, ""); !errors.Is(err, lab.ErrFenced) {
				t.Fatalf("MarkDelivered without a token: %v", err)
			}
			evs, _ := b.Events(ctx, "", 1)
			if ev := evs[0]; ev.State != lab.EventPending || ev.Attempts != 2 || ev.ClaimToken != second[0].ClaimToken || ev.LastError != "" {
				t.Fatalf("event %+v: the superseded claim changed it", ev)
			}
			if err := b.MarkDelivered(ctx, id, second[0].ClaimToken); err != nil {
				t.Fatalf("the holder's MarkDelivered: %v", err)
			}
			if err := b.MarkDelivered(ctx, id, second[0].ClaimToken); !errors.Is(err, lab.ErrFenced) {
				t.Fatalf("a second completion: %v, want ErrFenced", err)
			}
		})
	}
}

// TestRelaysShareOneOutbox: three relays of three workers each drain one
// outbox; no event is ever delivered by two of them at once.
func TestRelaysShareOneOutbox(t *testing.T) {
	all, c := setup(t)
	const events = 200
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			rcv := newReceiver(t, b)
			for i := range events {
				charge(t, b, c, fmt.Sprintf("k-share-%d", i))
			}
			rec := newCounting(rcv)
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			defer func() {
				cancel()
				wg.Wait()
			}()
			ticked := testsignal.New() // every worker of every relay signals it
			relays := make([]*relay.Relay, 3)
			for i := range relays {
				cfg := relay.Defaults()
				cfg.Interval, cfg.Batch, cfg.Workers = time.Millisecond, 7, 3
				cfg.Signals.Ticked = ticked
				relays[i] = newRelayWith(t, b, rec, c, cfg)
				wg.Go(func() { relays[i].Run(ctx) })
			}
			ticked.WaitUntil(t, "the outbox drained", func() bool {
				s, err := b.OutboxStats(t.Context(), "")
				return err == nil && s.Delivered == events
			})
			cancel()
			wg.Wait()

			rec.eachOnce(t, events)
			for i, r := range relays {
				if r.Fenced() != 0 {
					t.Errorf("relay %d: %d fenced completions", i, r.Fenced())
				}
			}
			s, _ := b.OutboxStats(t.Context(), "")
			if unique, deliveries, _ := rcv.receipts(t.Context(), "run-relay"); s.Pending != 0 || s.Dead != 0 || unique != events || deliveries != events {
				t.Fatalf("stats %+v, receipts %d, deliveries %d; want every event delivered once", s, unique, deliveries)
			}
			// The provider's own count of requests that overlapped one still in flight.
			if n := rcv.provider.Counters().InFlightOverlaps; n != 0 {
				t.Fatalf("the provider saw %d overlapping deliveries", n)
			}
			if applied, requests, _ := rcv.captures(t.Context(), "run-relay"); applied != events || requests != events {
				t.Fatalf("captures %d from %d requests; want %d, once each", applied, requests, events)
			}
		})
	}
}

// TestRequeue: a dead event goes back to pending, due now with its attempts
// reset, and is delivered; a delivered, a leased, an unknown or another
// namespace's event is refused.
func TestRequeue(t *testing.T) {
	all, c := setup(t)
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			rcv := newReceiver(t, b)
			ctx := t.Context()
			ev := charge(t, b, c, "k-requeue")
			p := &flaky{Receiver: rcv}
			p.failures.Store(2)
			r := newRelay(t, b, p, c, 2)
			for range 2 {
				if _, err := r.Tick(ctx); err != nil {
					t.Fatal(err)
				}
				c.Advance(2 * time.Minute)
			}
			if s, _ := b.OutboxStats(ctx, ""); s.Dead != 1 {
				t.Fatalf("stats %+v, want the event dead", s)
			}
			if _, err := b.Requeue(ctx, "globex", ev.ID); !errors.Is(err, lab.ErrEventNotFound) {
				t.Fatalf("another namespace's requeue: %v", err)
			}
			if _, err := b.Requeue(ctx, "acme", "00000000-0000-4000-8000-000000000000"); !errors.Is(err, lab.ErrEventNotFound) {
				t.Fatalf("unknown event: %v", err)
			}
			got, err := b.Requeue(ctx, "acme", ev.ID)
			if err != nil || got.State != lab.EventPending || got.Attempts != 0 || !got.NextAttempt.Equal(c.Now()) {
				t.Fatalf("requeued %+v, err %v: want pending, due now, no attempts", got, err)
			}
			// While a worker holds it, it is not re-queued under that worker.
			claimed, _ := b.ClaimDue(ctx, 1, time.Minute)
			if _, err := b.Requeue(ctx, "", ev.ID); !errors.Is(err, lab.ErrEventInFlight) || len(claimed) != 1 {
				t.Fatalf("requeue of a leased event: %v", err)
			}
			c.Advance(2 * time.Minute)
			if _, err := b.Requeue(ctx, "", ev.ID); err != nil { // the admin's view; the lease has ended
				t.Fatal(err)
			}
			if err := b.MarkDelivered(ctx, ev.ID, claimed[0].ClaimToken); !errors.Is(err, lab.ErrFenced) {
				t.Fatalf("a claim from before the requeue completed: %v", err)
			}
			if n, err := r.Tick(ctx); n != 1 || err != nil {
				t.Fatalf("delivered %d after the requeue (err %v)", n, err)
			}
			if _, err := b.Requeue(ctx, "acme", ev.ID); !errors.Is(err, lab.ErrEventDelivered) {
				t.Fatalf("requeue of a delivered event: %v", err)
			}
			if unique, deliveries, _ := rcv.receipts(ctx, "run-relay"); unique != 1 || deliveries != 1 {
				t.Fatalf("receipts %d, deliveries %d", unique, deliveries)
			}
		})
	}
}

// TestBackoffIsCappedWithJitter: each failure pushes the event back by the
// doubled base delay, capped, less at most 20% of jitter.
func TestBackoffIsCappedWithJitter(t *testing.T) {
	all, c := setup(t)
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			rcv := newReceiver(t, b)
			ctx := t.Context()
			charge(t, b, c, "k-backoff")
			p := &flaky{Receiver: rcv}
			p.failures.Store(1000)
			cfg := relay.Defaults()
			cfg.MaxAttempts, cfg.BaseBackoff, cfg.MaxBackoff = 20, 100*time.Millisecond, time.Second
			r := newRelayWith(t, b, p, c, cfg)
			for attempt := 1; attempt <= 8; attempt++ {
				if _, err := r.Tick(ctx); err != nil {
					t.Fatal(err)
				}
				evs, _ := b.Events(ctx, "", 1)
				got := evs[0].NextAttempt.Sub(c.Now())
				full := min(cfg.BaseBackoff<<(attempt-1), cfg.MaxBackoff)
				if got > full || got < full*8/10-time.Millisecond {
					t.Fatalf("attempt %d: retried after %s, want %s less at most 20%%", attempt, got, full)
				}
				c.Advance(2 * time.Second)
			}
		})
	}
}
