package relay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/relay"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
)

// flaky fails the first n deliveries, then passes them to the books.
type flaky struct {
	lab.Provider
	failures atomic.Int32
}

func (f *flaky) Deliver(ctx context.Context, e lab.Event, direct bool) (bool, error) {
	if f.failures.Add(-1) >= 0 {
		return false, errors.New("provider unavailable")
	}
	return f.Provider.Deliver(ctx, e, direct)
}

func books(t *testing.T) map[string]lab.Books {
	t.Helper()
	url, schema := labtest.Postgres(t)
	pool, err := postgres.Open(context.Background(), postgres.PoolConfig{URL: url, Schema: schema, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return map[string]lab.Books{"memory": memory.NewBooks(nil), "postgres": postgres.NewBooks(pool)}
}

func charge(t *testing.T, b lab.Books, key string) lab.Event {
	t.Helper()
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: 100, Currency: "USD"}
	a := lab.Attempt{Scope: lab.Scope{Tenant: "acme", Endpoint: lab.Endpoint, Key: key}, Request: req, Store: lab.StoreMemory, Run: "run-relay"}
	e := lab.NewEntry(a, time.Now())
	ev := lab.NewReceiptEvent(e)
	if _, err := b.Apply(context.Background(), lab.Apply{Entry: e, Event: ev}); err != nil {
		t.Fatal(err)
	}
	return *ev
}

func TestRelayRetriesThenDelivers(t *testing.T) {
	for name, b := range books(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			charge(t, b, "k1")
			p := &flaky{Provider: b}
			p.failures.Store(2)
			r := &relay.Relay{Outbox: b, Provider: p, BaseBackoff: time.Millisecond, Lease: time.Second}
			deadline := time.Now().Add(5 * time.Second)
			for {
				if _, err := r.Tick(ctx); err != nil {
					t.Fatal(err)
				}
				s, _ := b.OutboxStats(ctx)
				if s.Delivered == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not delivered: %+v", s)
				}
				time.Sleep(5 * time.Millisecond)
			}
			evs, _ := b.Events(ctx, 10)
			if len(evs) != 1 || evs[0].Attempts != 3 || evs[0].State != lab.EventDelivered {
				t.Fatalf("events %+v, want one delivered on its third attempt", evs)
			}
			if unique, deliveries, _ := b.Receipts(ctx, "run-relay"); unique != 1 || deliveries != 1 {
				t.Fatalf("receipts %d, deliveries %d", unique, deliveries)
			}
		})
	}
}

func TestRelayGivesUpVisibly(t *testing.T) {
	for name, b := range books(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			charge(t, b, "k-dead")
			p := &flaky{Provider: b}
			p.failures.Store(1000)
			r := &relay.Relay{Outbox: b, Provider: p, BaseBackoff: time.Millisecond, MaxAttempts: 3}
			for range 50 {
				if _, err := r.Tick(ctx); err != nil {
					t.Fatal(err)
				}
				if s, _ := b.OutboxStats(ctx); s.Dead == 1 {
					evs, _ := b.Events(ctx, 1)
					if evs[0].Attempts != 3 || evs[0].LastError == "" {
						t.Fatalf("dead event %+v", evs[0])
					}
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Fatal("the event never went dead")
		})
	}
}

// TestProviderDeduplicates shows why at-least-once is safe here: a second
// delivery of one event id is recorded as a duplicate, not a second receipt.
func TestProviderDeduplicates(t *testing.T) {
	for name, b := range books(t) {
		t.Run(name, func(t *testing.T) {
			ev := charge(t, b, "k-dup")
			for i, wantDup := range []bool{false, true, true} {
				dup, err := b.Deliver(context.Background(), ev, false)
				if err != nil || dup != wantDup {
					t.Fatalf("delivery %d: duplicate=%v err=%v", i+1, dup, err)
				}
			}
			if unique, deliveries, _ := b.Receipts(context.Background(), "run-relay"); unique != 1 || deliveries != 3 {
				t.Fatalf("receipts %d, deliveries %d; want 1 and 3", unique, deliveries)
			}
		})
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	b := memory.NewBooks(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		(&relay.Relay{Outbox: b, Provider: b, Interval: time.Millisecond}).Run(ctx)
		close(done)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("relay did not stop")
	}
}
