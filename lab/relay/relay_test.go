package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/relay"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

// books is what the relay and these tests use of the ground truth.
type books interface {
	lab.Ledger
	lab.CaptureRecorder
	relay.Outbox
	OutboxStats(ctx context.Context, ns lab.Namespace) (lab.OutboxStats, error)
	Events(ctx context.Context, ns lab.Namespace, limit int) ([]lab.Event, error)
	Requeue(ctx context.Context, ns lab.Namespace, id string) (lab.Event, error)
}

// flaky fails the first n deliveries, then passes them to the books.
type flaky struct {
	relay.Receiver
	failures atomic.Int32
}

func (f *flaky) Deliver(ctx context.Context, e lab.Event) (bool, error) {
	if f.failures.Add(-1) >= 0 {
		return false, errors.New("provider unavailable")
	}
	return f.Receiver.Deliver(ctx, e)
}

// setup returns both kinds of books on one hand-moved clock.
func setup(t *testing.T) (map[string]books, *labtest.Clock) {
	t.Helper()
	c := labtest.NewClock(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	url, schema := labtest.Postgres(t)
	pool, err := pgdb.Open(context.Background(), pgdb.PoolConfig{URL: url, Schema: schema, Size: 4, AppName: "relay-test", Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return map[string]books{"memory": inmem.NewBooks(c.Now), "postgres": pgdb.NewBooks(pool, c.Now)}, c
}

func newRelay(t *testing.T, b books, p relay.Receiver, c *labtest.Clock, maxAttempts int) *relay.Relay {
	t.Helper()
	cfg := relay.Defaults()
	cfg.MaxAttempts = maxAttempts
	return newRelayWith(t, b, p, c, cfg)
}

// newRelayWith returns a relay on cfg's settings.
func newRelayWith(t *testing.T, b books, p relay.Receiver, c *labtest.Clock, cfg relay.Config) *relay.Relay {
	t.Helper()
	cfg.Outbox, cfg.Provider, cfg.Clock, cfg.Logger = b, p, c.Now, slog.New(slog.DiscardHandler)
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func charge(t *testing.T, b books, c *labtest.Clock, key string) lab.Event {
	t.Helper()
	return chargeCents(t, b, c, key, 100)
}

// chargeCents charges cents USD to acme's acct-1 under key, with its event.
func chargeCents(t *testing.T, b books, c *labtest.Clock, key string, cents int64) lab.Event {
	t.Helper()
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: cents, Currency: "USD"}
	a := lab.Attempt{Scope: lab.Scope{Namespace: "acme", Tenant: "acme", Endpoint: lab.Endpoint, Key: key}, Request: req, Store: "memory", Run: "run-relay"}
	e := lab.NewEntry(a, c.Now())
	ev := lab.NewReceiptEvent(e, lab.Faults{})
	if _, err := b.Apply(context.Background(), lab.Apply{Entry: e, Event: ev}); err != nil {
		t.Fatal(err)
	}
	return *ev
}

func TestRelayRetriesThenDelivers(t *testing.T) {
	all, c := setup(t)
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			rcv := newReceiver(t, b)
			ctx := t.Context()
			charge(t, b, c, "k1")
			p := &flaky{Receiver: rcv}
			p.failures.Store(2)
			r := newRelay(t, b, p, c, 8)
			for tick := range 3 {
				n, err := r.Tick(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if want := map[bool]int{true: 1, false: 0}[tick == 2]; n != want {
					t.Fatalf("tick %d delivered %d, want %d", tick+1, n, want)
				}
				// Before its backoff ends the event is not due again.
				if n, _ := r.Tick(ctx); n != 0 {
					t.Fatalf("tick %d: delivered before the backoff ended", tick+1)
				}
				c.Advance(time.Minute)
			}
			evs, _ := b.Events(ctx, "", 10)
			if len(evs) != 1 || evs[0].Attempts != 3 || evs[0].State != lab.EventDelivered {
				t.Fatalf("events %+v, want one delivered on its third attempt", evs)
			}
			if unique, deliveries, _ := rcv.receipts(ctx, "run-relay"); unique != 1 || deliveries != 1 {
				t.Fatalf("receipts %d, deliveries %d", unique, deliveries)
			}
		})
	}
}

func TestRelayGivesUpVisibly(t *testing.T) {
	all, c := setup(t)
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			rcv := newReceiver(t, b)
			ctx := t.Context()
			charge(t, b, c, "k-dead")
			p := &flaky{Receiver: rcv}
			p.failures.Store(1000)
			r := newRelay(t, b, p, c, 3)
			for range 3 {
				if _, err := r.Tick(ctx); err != nil {
					t.Fatal(err)
				}
				c.Advance(2 * time.Minute) // past the capped backoff
			}
			s, _ := b.OutboxStats(ctx, "")
			evs, _ := b.Events(ctx, "", 1)
			if s.Dead != 1 || s.Pending != 0 || evs[0].Attempts != 3 || evs[0].LastError == "" {
				t.Fatalf("stats %+v, event %+v: want it dead after 3 attempts, with its last error", s, evs[0])
			}
			if _, err := r.Tick(ctx); err != nil || p.failures.Load() != 1000-3 {
				t.Fatalf("a dead event was tried again (%d failures left, err %v)", p.failures.Load(), err)
			}
		})
	}
}

// TestProviderDeduplicates shows why at-least-once is safe here: a second
// delivery of one event id is recorded as a duplicate, not a second receipt.
func TestProviderDeduplicates(t *testing.T) {
	all, c := setup(t)
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			rcv := newReceiver(t, b)
			ev := charge(t, b, c, "k-dup")
			for i, wantDup := range []bool{false, true, true} {
				dup, err := rcv.Deliver(t.Context(), ev)
				if err != nil || dup != wantDup {
					t.Fatalf("delivery %d: duplicate=%v err=%v", i+1, dup, err)
				}
			}
			if unique, deliveries, _ := rcv.receipts(t.Context(), "run-relay"); unique != 1 || deliveries != 3 {
				t.Fatalf("receipts %d, deliveries %d; want 1 and 3", unique, deliveries)
			}
		})
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	c := labtest.NewClock(time.Now())
	b := inmem.NewBooks(c.Now)
	r := newRelay(t, b, newReceiver(t, b), c, 8)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		r.Run(ctx)
		close(done)
	}()
	cancel()
	testsignal.Receive(t, "the relay stopping", done)
}

func TestNewRejectsBadSettings(t *testing.T) {
	c := labtest.NewClock(time.Time{})
	b := inmem.NewBooks(c.Now)
	for name, mutate := range map[string]func(*relay.Config){
		"no outbox":    func(cfg *relay.Config) { cfg.Outbox = nil },
		"zero batch":   func(cfg *relay.Config) { cfg.Batch = 0 },
		"zero lease":   func(cfg *relay.Config) { cfg.Lease = 0 },
		"no attempts":  func(cfg *relay.Config) { cfg.MaxAttempts = 0 },
		"no clock":     func(cfg *relay.Config) { cfg.Clock = nil },
		"zero backoff": func(cfg *relay.Config) { cfg.BaseBackoff = 0 },
		"no workers":   func(cfg *relay.Config) { cfg.Workers = 0 },
		"max below workers": func(cfg *relay.Config) {
			cfg.Workers, cfg.MaxWorkers = 3, 2
		},
		"cap below base": func(cfg *relay.Config) {
			cfg.BaseBackoff, cfg.MaxBackoff = time.Minute, time.Second
		},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := relay.Defaults()
			cfg.Outbox, cfg.Provider, cfg.Clock, cfg.Logger = b, newReceiver(t, b), c.Now, slog.New(slog.DiscardHandler)
			mutate(&cfg)
			if _, err := relay.New(cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// claimCounter counts the relay's claims on the outbox.
type claimCounter struct {
	books
	claims atomic.Int32
}

func (c *claimCounter) ClaimDue(ctx context.Context, limit int, lease time.Duration) ([]lab.Event, error) {
	c.claims.Add(1)
	return c.books.ClaimDue(ctx, limit, lease)
}

// TestHeldRelayClaimsNothingUntilResumed runs a relay held from the start
// on a 1 ms tick: the event waits in the outbox, unclaimed, however many
// ticks pass; resumed, the relay delivers it.
func TestHeldRelayClaimsNothingUntilResumed(t *testing.T) {
	c := labtest.NewClock(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := &claimCounter{books: inmem.NewBooks(c.Now)}
	charge(t, b.books, c, "k-held")
	cfg := relay.Defaults()
	cfg.Interval = time.Millisecond
	cfg.Signals.Ticked = testsignal.New()
	r := newRelayWith(t, b, newReceiver(t, b), c, cfg)
	r.Hold(true)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		r.Run(ctx)
		close(done)
	}()
	defer func() {
		cancel()
		<-done
	}()
	for range 5 { // some ticks pass while held
		cfg.Signals.Ticked.WaitOrTimeout(t, "a held relay's tick")
	}
	if n := b.claims.Load(); n != 0 {
		t.Fatalf("a held relay claimed %d times", n)
	}
	if st, err := b.OutboxStats(ctx, ""); err != nil || st.Pending != 1 {
		t.Fatalf("outbox %+v (%v), want the event pending", st, err)
	}
	r.Hold(false)
	cfg.Signals.Ticked.WaitUntil(t, "the resumed relay delivering the event", func() bool {
		st, err := b.OutboxStats(ctx, "")
		return err == nil && st.Delivered == 1 && st.Pending == 0
	})
	if r.Counts().Delivered != 1 {
		t.Fatalf("counts %+v, want one delivered", r.Counts())
	}
}
