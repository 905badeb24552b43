package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/redisdb"
	"github.com/idempotency-lab/lab/variants/redis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(labtest.WithServices(m)) }

// servers are the Redis servers every test runs against: the embedded one
// always, and the real one at REDIS_URL, the machine's or the test
// binary's own (labtest.WithServices), when there is one.
func servers(t *testing.T) map[string]string {
	t.Helper()
	e, err := redisdb.StartEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	out := map[string]string{"embedded": e.URL()}
	if url, _, ok := labtest.OptionalRedis(t); ok {
		out["real"] = url
	}
	return out
}

// eachServer runs test as a subtest against every server.
func eachServer(t *testing.T, test func(t *testing.T, url string)) {
	t.Helper()
	for name, url := range servers(t) {
		t.Run(name, func(t *testing.T) { test(t, url) })
	}
}

func newStore(t testing.TB, url string, books lab.Ledger) *redis.Store {
	t.Helper()
	opts, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	client := goredis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	s, err := redis.New(redis.Config{Client: client, Ledger: books, Prefix: "lab-test-" + t.Name() + ":",
		Window: 24 * time.Hour, Wait: 2 * time.Second, ClaimTTL: 30 * time.Second, Now: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Reset(context.Background(), "") })
	return s
}

func attempt(key string, amount int64, f lab.Faults) lab.Attempt {
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: amount, Currency: "USD"}
	return lab.Attempt{
		Scope: lab.Scope{Namespace: "acme", Tenant: "acme", Endpoint: lab.Endpoint, Key: key}, Request: req,
		Fingerprint: req.Fingerprint(), Store: redis.Name, Faults: f,
	}
}

func TestClaimsAndReplays(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, url string) {
		books := inmem.NewBooks(time.Now)
		s := newStore(t, url, books)
		var wg sync.WaitGroup
		var mu sync.Mutex
		fresh := 0
		for range 20 {
			wg.Go(func() {
				out, err := s.Charge(context.Background(), attempt("k", 100, lab.Faults{}))
				if err != nil {
					t.Error(err)
					return
				}
				if !out.Replayed {
					mu.Lock()
					fresh++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if k, _ := books.KeyCharges(context.Background(), "acme", redis.Name, "k"); k.Charges != 1 || fresh != 1 {
			t.Fatalf("charges %d, fresh answers %d; want 1 and 1", k.Charges, fresh)
		}
		if _, err := s.Charge(context.Background(), attempt("k", 999, lab.Faults{})); !errors.Is(err, lab.ErrKeyReused) {
			t.Fatalf("other amount: %v", err)
		}
	})
}

// TestTTLsRunInRealTime: the embedded Redis expires keys on the wall clock,
// so a claim that outlives its TTL is lost exactly as on a real server.
func TestTTLsRunInRealTime(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, url string) {
		books := inmem.NewBooks(time.Now)
		s := newStore(t, url, books)
		ctx := context.Background()
		if _, err := s.Charge(ctx, attempt("k-ttl", 100, lab.Faults{Retention: 100 * time.Millisecond})); err != nil {
			t.Fatal(err)
		}
		if k, _ := s.Lookup(ctx, attempt("k-ttl", 100, lab.Faults{}).Scope); k.State != lab.KeyCompleted {
			t.Fatalf("state %s right after the charge", k.State)
		}
		// The server's clock runs the TTL: wait for it, bounded.
		deadline := time.Now().Add(2 * time.Second)
		for {
			k, _ := s.Lookup(ctx, attempt("k-ttl", 100, lab.Faults{}).Scope)
			st := k.State
			if st == lab.KeyAbsent {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("state %s two seconds after a 100 ms TTL, want absent", st)
			}
			_ = lab.Sleep(ctx, 20*time.Millisecond)
		}
	})
}

// TestExpiredClaimIsNotCompleted: a worker whose claim expired mid-work
// must not overwrite the key: the compare-and-set on its token refuses.
func TestExpiredClaimIsNotCompleted(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, url string) {
		books := inmem.NewBooks(time.Now)
		s := newStore(t, url, books)
		ctx := context.Background()
		slow := lab.Faults{Point: lab.FaultSlow, Work: 300 * time.Millisecond, ClaimTTL: 100 * time.Millisecond}
		if _, err := s.Charge(ctx, attempt("k-slow", 100, slow)); err != nil {
			t.Fatal(err)
		}
		if k, _ := s.Lookup(ctx, attempt("k-slow", 100, lab.Faults{}).Scope); k.State != lab.KeyAbsent {
			t.Fatalf("state %s: the expired claim's owner stored its record", k.State)
		}
	})
}

func TestCrashAfterClaimLeavesTheClaim(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, url string) {
		books := inmem.NewBooks(time.Now)
		s := newStore(t, url, books)
		ctx := context.Background()
		f := lab.Faults{Point: lab.FaultCrashAfterClaim, ClaimTTL: 300 * time.Millisecond}
		if _, err := s.Charge(ctx, attempt("k-crash", 100, f)); !errors.Is(err, lab.ErrCrash) {
			t.Fatalf("got %v", err)
		}
		if k, _ := s.Lookup(ctx, attempt("k-crash", 100, lab.Faults{}).Scope); k.State != lab.KeyInFlight {
			t.Fatalf("state %s, want the claim left behind", k.State)
		}
		// The bounded wait (2 s) outlasts the TTL: the retry claims and charges once.
		if out, err := s.Charge(ctx, attempt("k-crash", 100, lab.Faults{})); err != nil || out.Replayed {
			t.Fatalf("retry: %v", err)
		}
		if k, _ := books.KeyCharges(ctx, "acme", redis.Name, "k-crash"); k.Charges != 1 {
			t.Fatalf("charges %d", k.Charges)
		}
	})
}

// TestRestartDeletesOnlyTheLabsKeys: the restart fault never flushes the
// database.
func TestRestartDeletesOnlyTheLabsKeys(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, url string) {
		s := newStore(t, url, inmem.NewBooks(time.Now))
		opts, _ := goredis.ParseURL(url)
		other := goredis.NewClient(opts)
		defer other.Close()
		ctx := context.Background()
		foreign := "someone-else:" + t.Name()
		if err := other.Set(ctx, foreign, "keep me", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		defer other.Del(ctx, foreign)
		if _, err := s.Charge(ctx, attempt("k-restart", 100, lab.Faults{})); err != nil {
			t.Fatal(err)
		}
		if err := s.Restart(ctx, lab.Region{}); err != nil {
			t.Fatal(err)
		}
		if k, _ := s.Lookup(ctx, attempt("k-restart", 100, lab.Faults{}).Scope); k.State != lab.KeyAbsent {
			t.Fatalf("lab key survived the restart: %s", k.State)
		}
		if v, err := other.Get(ctx, foreign).Result(); err != nil || v != "keep me" {
			t.Fatalf("foreign key: %q %v", v, err)
		}
	})
}

// TestAmbiguousCommitIsNotChargedTwice: when the ledger's answer is lost
// even after retrying, the key stays unsettled with its charge id; the
// client's retry takes it over and the ledger answers with the recorded
// charge instead of charging again.
func TestAmbiguousCommitIsNotChargedTwice(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, url string) {
		books := inmem.NewBooks(time.Now)
		failures := new(atomic.Int32)
		failures.Store(3)
		s := newStore(t, url, labtest.LostCommit{Ledger: books, Failures: failures})
		ctx := context.Background()
		if _, err := s.Charge(ctx, attempt("k-lost", 100, lab.Faults{})); !errors.Is(err, lab.ErrOutcomeUnknown) {
			t.Fatalf("first: %v, want an unknown outcome", err)
		}
		if k, _ := s.Lookup(ctx, attempt("k-lost", 100, lab.Faults{}).Scope); k.State != lab.KeyInFlight {
			t.Fatalf("state %s, want the key kept", k.State)
		}
		if _, err := s.Charge(ctx, attempt("k-lost", 999, lab.Faults{})); !errors.Is(err, lab.ErrKeyReused) {
			t.Fatalf("another request on the unsettled key: %v", err)
		}
		retry, err := s.Charge(ctx, attempt("k-lost", 100, lab.Faults{}))
		if err != nil || retry.Replayed {
			t.Fatalf("retry: %v replayed=%v", err, retry.Replayed)
		}
		if k, _ := books.KeyCharges(ctx, "acme", redis.Name, "k-lost"); k.Charges != 1 {
			t.Fatalf("charges %d, want 1", k.Charges)
		}
	})
}

// TestTakeOverNeverGivesUpTheChargeID: see the memory store's test of the
// same name.
func TestTakeOverNeverGivesUpTheChargeID(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, url string) {
		books := inmem.NewBooks(time.Now)
		failures := new(atomic.Int32)
		failures.Store(3)
		s := newStore(t, url, labtest.LostCommit{Ledger: books, Failures: failures})
		bg := context.Background()
		if _, err := s.Charge(bg, attempt("k-take", 100, lab.Faults{})); !errors.Is(err, lab.ErrOutcomeUnknown) {
			t.Fatalf("first: %v", err)
		}
		ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
		defer cancel()
		if _, err := s.Charge(ctx, attempt("k-take", 100, lab.Faults{Point: lab.FaultSlow, Work: time.Second})); err == nil {
			t.Fatal("the interrupted retry succeeded")
		}
		if _, err := s.Charge(bg, attempt("k-take", 100, lab.Faults{})); err != nil {
			t.Fatalf("plain retry: %v", err)
		}
		if k, _ := books.KeyCharges(bg, "acme", redis.Name, "k-take"); k.Charges != 1 {
			t.Fatalf("charges %d, want 1", k.Charges)
		}
	})
}

// TestKeysComeFromTheListing: a namespace's keys are listed newest first
// from its listing, another namespace's are not, and a restart of one
// namespace leaves the other's listing whole.
func TestKeysComeFromTheListing(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, url string) {
		books := inmem.NewBooks(time.Now)
		s := newStore(t, url, books)
		ctx := context.Background()
		for i := range 30 {
			for _, tenant := range []string{"acme", "beta"} {
				a := attempt(fmt.Sprint("k-", i), 100, lab.Faults{})
				a.Scope.Namespace, a.Scope.Tenant = lab.Namespace(tenant), tenant
				if _, err := s.Charge(ctx, a); err != nil {
					t.Fatal(err)
				}
			}
		}
		keys, total, err := s.Keys(ctx, "acme", 5)
		if err != nil || total != 30 || len(keys) != 5 {
			t.Fatalf("acme: %d keys of %d (%v)", len(keys), total, err)
		}
		for _, k := range keys {
			if k.Tenant != "acme" || k.State != lab.KeyCompleted {
				t.Fatalf("acme's listing holds %+v", k)
			}
		}
		if err := s.Restart(ctx, lab.Region{Namespace: "beta"}); err != nil {
			t.Fatal(err)
		}
		if _, total, _ := s.Keys(ctx, "beta", 5); total != 0 {
			t.Fatalf("beta lists %d keys after its restart", total)
		}
		if _, total, _ := s.Keys(ctx, "", 100); total != 30 {
			t.Fatalf("every namespace: %d keys, want acme's 30", total)
		}
	})
}

// nopLedger answers every charge without keeping it, so a benchmark
// measures the store's own work.
type nopLedger struct{}

func (nopLedger) Apply(_ context.Context, a lab.Apply) (lab.Charge, error) {
	e := a.Entry
	return lab.Charge{ID: e.ChargeID, Account: e.Account, AmountCents: e.AmountCents, Currency: e.Currency, BalanceCents: e.AmountCents, CreatedAt: e.CreatedAt}, nil
}

// benchServer is the real Redis when there is one, else the embedded one.
func benchServer(b *testing.B) string {
	if url, _, ok := labtest.OptionalRedis(b); ok {
		return url
	}
	e, err := redisdb.StartEmbedded()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.Close)
	return e.URL()
}

// BenchmarkClaim: a fresh key claimed, charged (on a ledger that keeps
// nothing) and its response stored.
func BenchmarkClaim(b *testing.B) {
	url := benchServer(b)
	s := newStore(b, url, nopLedger{})
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Charge(ctx, attempt(fmt.Sprint("fresh-", i), 2500, lab.Faults{})); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplay: a retry answered from the stored response (SET NX GET,
// one command).
func BenchmarkReplay(b *testing.B) {
	url := benchServer(b)
	s := newStore(b, url, nopLedger{})
	ctx := context.Background()
	a := attempt("replayed", 2500, lab.Faults{})
	if _, err := s.Charge(ctx, a); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if out, err := s.Charge(ctx, a); err != nil || !out.Replayed {
			b.Fatal(out, err)
		}
	}
}

// TestConfinedRestartForgetsOnlyItsKeys: a restart confined to a key prefix
// (a matrix cell's) deletes the namespace's keys under it and keeps the
// others, the caller's own among them.
func TestConfinedRestartForgetsOnlyItsKeys(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, url string) {
		s := newStore(t, url, inmem.NewBooks(time.Now))
		ctx := context.Background()
		for _, key := range []string{"matrix-b1-restart", "matrix-b1-other", "mine-1", "matrix-b2-x"} {
			if _, err := s.Charge(ctx, attempt(key, 100, lab.Faults{})); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Restart(ctx, lab.Region{Namespace: "acme", KeyPrefix: "matrix-b1-"}); err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]string{"matrix-b1-restart": lab.KeyAbsent, "matrix-b1-other": lab.KeyAbsent,
			"mine-1": lab.KeyCompleted, "matrix-b2-x": lab.KeyCompleted} {
			if k, err := s.Lookup(ctx, attempt(key, 100, lab.Faults{}).Scope); err != nil || k.State != want {
				t.Errorf("%s after the confined restart: %s (%v), want %s", key, k.State, err, want)
			}
		}
	})
}
