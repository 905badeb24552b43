package memory_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/variants/memory"
)

// clock is a test clock advanced by hand.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func attempt(key string, amount int64) lab.Attempt {
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: amount, Currency: "USD"}
	return lab.Attempt{
		Scope: lab.Scope{Tenant: "acme", Endpoint: lab.Endpoint, Key: key}, Request: req,
		Fingerprint: req.Fingerprint(), Store: lab.StoreMemory,
	}
}

func TestConcurrentClaimsChargeOnce(t *testing.T) {
	books := memory.NewBooks(nil)
	s := memory.New(memory.Config{Ledger: books})
	var wg sync.WaitGroup
	var replays atomic.Int32
	for range 64 {
		wg.Go(func() {
			out, err := s.Charge(context.Background(), attempt("k", 100))
			if err != nil {
				t.Error(err)
			}
			if out.Replayed {
				replays.Add(1)
			}
		})
	}
	wg.Wait()
	if n, _ := books.KeyCharges(context.Background(), "acme", lab.StoreMemory, "k"); n != 1 || replays.Load() != 63 {
		t.Fatalf("charges %d, replays %d; want 1 and 63", n, replays.Load())
	}
}

func TestExpiredKeysAreEvicted(t *testing.T) {
	var c clock
	s := memory.New(memory.Config{Ledger: memory.NewBooks(c.now), Window: time.Second, Now: c.now})
	ctx := context.Background()
	for i := range 10_000 {
		if _, err := s.Charge(ctx, attempt(fmt.Sprint("fresh-", i), 100)); err != nil {
			t.Fatal(err)
		}
		c.advance(time.Millisecond) // a stream of 1,000 fresh keys per second
	}
	// With a 1 s window only the last ~1,000 keys may stay, without any sweeper.
	if n := s.Len(); n > 1_010 {
		t.Fatalf("table holds %d keys; eviction does not bound it", n)
	}
	c.advance(2 * time.Second)
	if n, _ := s.Sweep(ctx); n == 0 || s.Len() != 0 {
		t.Fatalf("sweep evicted %d, %d left", n, s.Len())
	}
}

func TestFailedWorkReleasesTheKey(t *testing.T) {
	books := memory.NewBooks(nil)
	s := memory.New(memory.Config{Ledger: books})
	a := attempt("k-fail", 100)
	a.Faults = lab.Faults{Point: lab.FaultOutboxFail}
	if _, err := s.Charge(context.Background(), a); err == nil {
		t.Fatal("outbox failure did not fail the charge")
	}
	if st, _ := s.Lookup(context.Background(), a.Scope); st != lab.KeyAbsent {
		t.Fatalf("key after failure: %s", st)
	}
	out, err := s.Charge(context.Background(), attempt("k-fail", 100))
	if err != nil || out.Replayed {
		t.Fatalf("retry: %v replayed=%v", err, out.Replayed)
	}
	if n, _ := books.KeyCharges(context.Background(), "acme", lab.StoreMemory, "k-fail"); n != 1 {
		t.Fatalf("charges %d, want 1", n)
	}
}

// BenchmarkFreshKeys charges a stream of fresh keys with a short window and
// reports the table size it settles at.
func BenchmarkFreshKeys(b *testing.B) {
	var c clock
	s := memory.New(memory.Config{Ledger: memory.NewBooks(c.now), Window: 100 * time.Millisecond, Now: c.now})
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Charge(ctx, attempt(fmt.Sprint("k", i), 100)); err != nil {
			b.Fatal(err)
		}
		c.advance(10 * time.Microsecond)
	}
	b.ReportMetric(float64(s.Len()), "keys_held")
}
