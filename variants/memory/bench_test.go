package memory_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/variants/memory"
)

// stubLedger answers every Apply with the charge a ledger would return and
// keeps nothing, so that the benchmarks count the store and nothing else.
type stubLedger struct{}

func (stubLedger) Apply(_ context.Context, a lab.Apply) (lab.Charge, error) {
	e := a.Entry
	return lab.Charge{ID: e.ChargeID, Account: e.Account, AmountCents: e.AmountCents, Currency: e.Currency,
		OrderID: e.OrderID, BalanceCents: e.AmountCents, CreatedAt: e.CreatedAt}, nil
}

// BenchmarkRetainedKeys reports the heap one completed key costs while the
// store retains it: 300,000 keys charged, all within their window, the
// store's heap measured after a collection. Each attempt brings strings of
// its own, as one parsed from an HTTP request does (a UUID key, a fresh
// fingerprint), so a store that keeps them pays for them.
func BenchmarkRetainedKeys(b *testing.B) {
	const keys = 300_000
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: 2500, Currency: lab.DefaultCurrency}
	ctx := context.Background()
	for b.Loop() {
		s := newStore(b, memory.Config{Ledger: stubLedger{}, Window: 24 * time.Hour, Now: time.Now})
		before := heapAlloc()
		for range keys {
			a := lab.Attempt{
				Scope: lab.Scope{Namespace: "acme", Tenant: "acme", Endpoint: lab.Endpoint, Key: uuid.NewString()}, Request: req,
				Fingerprint: req.Fingerprint(), Store: memory.Name,
			}
			if _, err := s.Charge(ctx, a); err != nil {
				b.Fatal(err)
			}
		}
		after := heapAlloc()
		if n := s.Len(); n != keys {
			b.Fatalf("the store holds %d keys, want %d", n, keys)
		}
		b.ReportMetric(float64(int64(after)-int64(before))/keys, "bytes/key")
	}
}

// heapAlloc is the live heap after a full collection.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkClaim charges a fresh key each time: the claim, the work with a
// ledger that keeps nothing, the completion. A short window on a clock that
// moves keeps the table at a steady size, as a live server's is.
func BenchmarkClaim(b *testing.B) {
	var c clock
	s := newStore(b, memory.Config{Ledger: stubLedger{}, Window: 100 * time.Millisecond, Now: c.now})
	a := attempt("", 2500)
	ctx := context.Background()
	key := []byte("k-")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		a.Scope.Key = string(strconv.AppendInt(key[:2], int64(i), 10)) // one allocation, as a request's header value is
		if out, err := s.Charge(ctx, a); err != nil || out.Replayed {
			b.Fatalf("%v replayed=%v", err, out.Replayed)
		}
		c.advance(10 * time.Microsecond)
	}
}

// BenchmarkReplay retries one completed key.
func BenchmarkReplay(b *testing.B) {
	s := newStore(b, memory.Config{Ledger: stubLedger{}})
	a := attempt("k-replayed", 2500)
	ctx := context.Background()
	if _, err := s.Charge(ctx, a); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if out, err := s.Charge(ctx, a); err != nil || !out.Replayed {
			b.Fatalf("%v replayed=%v", err, out.Replayed)
		}
	}
}

// BenchmarkKeysOf300k lists the newest 20 keys of a store holding 300,000:
// what /idempotency/state costs, and how long it holds the store's lock,
// grows with the keys listed, not with the keys held.
func BenchmarkKeysOf300k(b *testing.B) {
	s := newStore(b, memory.Config{Ledger: stubLedger{}, Window: 24 * time.Hour, Now: time.Now})
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: 2500, Currency: lab.DefaultCurrency}
	ctx := context.Background()
	for i := range 300_000 {
		a := lab.Attempt{Scope: lab.Scope{Namespace: "acme", Tenant: "acme", Endpoint: lab.Endpoint, Key: "k-" + strconv.Itoa(i)}, Request: req,
			Fingerprint: req.Fingerprint(), Store: memory.Name}
		if _, err := s.Charge(ctx, a); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		keys, total, err := s.Keys(ctx, "acme", 20)
		if err != nil || len(keys) != 20 || total != 300_000 {
			b.Fatalf("%d keys of %d: %v", len(keys), total, err)
		}
	}
}
