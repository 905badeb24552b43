package memory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
)

// newStore builds a store on cfg, with the lab's defaults where cfg has none.
func newStore(tb testing.TB, cfg memory.Config) *memory.Store {
	tb.Helper()
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Ledger == nil {
		cfg.Ledger = inmem.NewBooks(cfg.Now)
	}
	if cfg.Window == 0 {
		cfg.Window = 24 * time.Hour
	}
	if cfg.Wait == 0 {
		cfg.Wait = 2 * time.Second
	}
	s, err := memory.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// clock is a test clock advanced by hand.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func attempt(key string, amount int64) lab.Attempt {
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: amount, Currency: "USD"}
	return lab.Attempt{
		Scope: lab.Scope{Namespace: "acme", Tenant: "acme", Endpoint: lab.Endpoint, Key: key}, Request: req,
		Fingerprint: req.Fingerprint(), Store: memory.Name,
	}
}

func TestConcurrentClaimsChargeOnce(t *testing.T) {
	t.Parallel()
	books := inmem.NewBooks(time.Now)
	s := newStore(t, memory.Config{Ledger: books})
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
	if k, _ := books.KeyCharges(context.Background(), "acme", memory.Name, "k"); k.Charges != 1 || replays.Load() != 63 {
		t.Fatalf("charges %d, replays %d; want 1 and 63", k.Charges, replays.Load())
	}
}

func TestExpiredKeysAreEvicted(t *testing.T) {
	t.Parallel()
	var c clock
	s := newStore(t, memory.Config{Ledger: inmem.NewBooks(c.now), Window: time.Second, Now: c.now})
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
	t.Parallel()
	books := inmem.NewBooks(time.Now)
	s := newStore(t, memory.Config{Ledger: books})
	a := attempt("k-fail", 100)
	a.Faults = lab.Faults{Point: lab.FaultOutboxFail}
	if _, err := s.Charge(context.Background(), a); err == nil {
		t.Fatal("outbox failure did not fail the charge")
	}
	if k, _ := s.Lookup(context.Background(), a.Scope); k.State != lab.KeyAbsent {
		t.Fatalf("key after failure: %s", k.State)
	}
	out, err := s.Charge(context.Background(), attempt("k-fail", 100))
	if err != nil || out.Replayed {
		t.Fatalf("retry: %v replayed=%v", err, out.Replayed)
	}
	if k, _ := books.KeyCharges(context.Background(), "acme", memory.Name, "k-fail"); k.Charges != 1 {
		t.Fatalf("charges %d, want 1", k.Charges)
	}
}

// BenchmarkFreshKeys charges a stream of fresh keys with a short window and
// reports the table size it settles at.
func BenchmarkFreshKeys(b *testing.B) {
	var c clock
	s := newStore(b, memory.Config{Ledger: inmem.NewBooks(c.now), Window: 100 * time.Millisecond, Now: c.now})
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

// TestCrashTakesDownWaiters: twins waiting on a request whose replica
// crashes die with it (their connections would), instead of sitting out
// the bounded wait.
func TestCrashTakesDownWaiters(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newStore(t, memory.Config{Wait: 5 * time.Second})
		owner := attempt("k-crash", 100)
		owner.Faults = lab.Faults{Point: lab.FaultSlow, Work: 600 * time.Millisecond}
		done := make(chan error, 1)
		go func() {
			_, err := s.Charge(context.Background(), owner)
			done <- err
		}()
		synctest.Wait() // the owner holds the claim and works
		waiter := make(chan error, 1)
		go func() {
			_, err := s.Charge(context.Background(), attempt("k-crash", 100))
			waiter <- err
		}()
		synctest.Wait() // the twin waits on the owner
		crasher := attempt("other-key", 100)
		crasher.Faults = lab.Faults{Point: lab.FaultCrashAfterClaim}
		if _, err := s.Charge(context.Background(), crasher); err != lab.ErrCrash {
			t.Fatalf("crasher: %v", err)
		}
		synctest.Wait()
		select {
		case err := <-waiter:
			if err != lab.ErrCrash {
				t.Fatalf("waiter: %v, want it taken down by the crash", err)
			}
		default:
			t.Fatal("the waiter sat out its wait")
		}
		if err := <-done; err != lab.ErrCrash { // the owner dies with its replica (closing done twice would panic)
			t.Fatalf("owner: %v", err)
		}
	})
}

// TestAmbiguousCommitIsNotChargedTwice: when the ledger's answer is lost,
// the store retries the same charge id, which the ledger answers with the
// recorded charge instead of charging again — within the request, or on
// the client's retry when the ledger stays silent longer.
func TestAmbiguousCommitIsNotChargedTwice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		failures int32
	}{{"SettledWithinTheRequest", 1}, {"SettledOnTheClientsRetry", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			books := inmem.NewBooks(time.Now)
			failures := new(atomic.Int32)
			failures.Store(tc.failures)
			s := newStore(t, memory.Config{Ledger: labtest.LostCommit{Ledger: books, Failures: failures}})
			ctx := context.Background()
			first, err := s.Charge(ctx, attempt("k-lost", 100))
			if tc.failures >= 3 {
				if !errors.Is(err, lab.ErrOutcomeUnknown) {
					t.Fatalf("first: %v, want an unknown outcome", err)
				}
				if _, err := s.Charge(ctx, attempt("k-lost", 999)); !errors.Is(err, lab.ErrKeyReused) {
					t.Fatalf("another request on the unsettled key: %v", err)
				}
				if first, err = s.Charge(ctx, attempt("k-lost", 100)); err != nil || first.Replayed {
					t.Fatalf("client's retry: %v replayed=%v", err, first.Replayed)
				}
			} else if err != nil || first.Response.Status != 201 {
				t.Fatalf("first: %v %d", err, first.Response.Status)
			}
			again, err := s.Charge(ctx, attempt("k-lost", 100))
			if err != nil || !again.Replayed || string(again.Response.Body) != string(first.Response.Body) {
				t.Fatalf("replay: %v replayed=%v", err, again.Replayed)
			}
			if k, _ := books.KeyCharges(ctx, "acme", memory.Name, "k-lost"); k.Charges != 1 {
				t.Fatalf("charges %d, want 1", k.Charges)
			}
		})
	}
}

// TestTakeOverNeverGivesUpTheChargeID: a retry that takes over an unsettled
// key and then fails (its client leaves during the work) keeps the key and
// its charge id, so the lost commit is still never repeated.
func TestTakeOverNeverGivesUpTheChargeID(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		books := inmem.NewBooks(time.Now)
		failures := new(atomic.Int32)
		failures.Store(3)
		s := newStore(t, memory.Config{Ledger: labtest.LostCommit{Ledger: books, Failures: failures}})
		bg := context.Background()
		if _, err := s.Charge(bg, attempt("k-take", 100)); !errors.Is(err, lab.ErrOutcomeUnknown) {
			t.Fatalf("first: %v", err)
		}
		slow := attempt("k-take", 100)
		slow.Faults = lab.Faults{Point: lab.FaultSlow, Work: time.Second}
		ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond) // the client leaves mid-work
		defer cancel()
		if _, err := s.Charge(ctx, slow); err == nil {
			t.Fatal("the interrupted retry succeeded")
		}
		if _, err := s.Charge(bg, attempt("k-take", 100)); err != nil {
			t.Fatalf("plain retry: %v", err)
		}
		if k, _ := books.KeyCharges(bg, "acme", memory.Name, "k-take"); k.Charges != 1 {
			t.Fatalf("charges %d, want 1", k.Charges)
		}
	})
}

// TestUnsettledKeysExpire: an unsettled key is kept no longer than a
// completed one, so the table stays bounded even if nobody retries.
func TestUnsettledKeysExpire(t *testing.T) {
	t.Parallel()
	var c clock
	failures := new(atomic.Int32)
	failures.Store(3)
	s := newStore(t, memory.Config{Ledger: labtest.LostCommit{Ledger: inmem.NewBooks(c.now), Failures: failures}, Window: time.Hour, Now: c.now})
	ctx := context.Background()
	if _, err := s.Charge(ctx, attempt("k-unsettled", 100)); !errors.Is(err, lab.ErrOutcomeUnknown) {
		t.Fatalf("first: %v", err)
	}
	if k, _ := s.Lookup(ctx, attempt("k-unsettled", 100).Scope); k.State != lab.KeyInFlight {
		t.Fatalf("state %s, want kept", k.State)
	}
	c.advance(2 * time.Hour)
	if n, _ := s.Sweep(ctx); n != 1 || s.Len() != 0 {
		t.Fatalf("swept %d, %d left", n, s.Len())
	}
}

// TestKeysListsTheNewestOfANamespace: the listing walks the namespace's
// newest claims only, and another namespace's crash takes nothing from it.
func TestKeysListsTheNewestOfANamespace(t *testing.T) {
	t.Parallel()
	c := labtest.NewClock(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	s := newStore(t, memory.Config{Now: c.Now})
	ctx := context.Background()
	for i := range 50 {
		a := attempt(fmt.Sprint("a-", i), 100)
		if _, err := s.Charge(ctx, a); err != nil {
			t.Fatal(err)
		}
		b := attempt(fmt.Sprint("b-", i), 100)
		b.Scope.Namespace, b.Scope.Tenant = "beta", "beta"
		if _, err := s.Charge(ctx, b); err != nil {
			t.Fatal(err)
		}
		c.Advance(time.Millisecond)
	}
	crash := attempt("b-crash", 100)
	crash.Scope.Namespace, crash.Scope.Tenant, crash.Faults = "beta", "beta", lab.Faults{Point: lab.FaultCrashAfterCharge}
	if _, err := s.Charge(ctx, crash); !errors.Is(err, lab.ErrCrash) {
		t.Fatalf("crash: %v", err)
	}
	keys, total, err := s.Keys(ctx, "acme", 3)
	if err != nil || total != 50 || len(keys) != 3 {
		t.Fatalf("acme: %d keys of %d (%v)", len(keys), total, err)
	}
	for i, want := range []string{"a-49", "a-48", "a-47"} {
		if keys[i].Key != want || keys[i].Tenant != "acme" || keys[i].State != lab.KeyCompleted {
			t.Fatalf("key %d: %+v, want %s", i, keys[i], want)
		}
	}
	if _, total, _ := s.Keys(ctx, "beta", 10); total != 0 {
		t.Fatalf("beta holds %d keys after its crash, want none", total)
	}
	if _, total, _ := s.Keys(ctx, "", 10); total != 50 {
		t.Fatalf("every namespace: %d keys, want acme's 50", total)
	}
}

// TestScopesNeverCollide: scopes whose parts join into the same text are
// still different keys, and each is reported as it was given.
func TestScopesNeverCollide(t *testing.T) {
	t.Parallel()
	s := newStore(t, memory.Config{})
	ctx := context.Background()
	scopes := []lab.Scope{
		{Namespace: "acme", Tenant: "acme", Endpoint: "POST /x", Key: "y"},
		{Namespace: "acme", Tenant: "acme", Endpoint: "POST /", Key: "xy"},
		{Namespace: "acme", Tenant: "acme", Endpoint: "", Key: "POST /xy"},
		{Namespace: "acme", Tenant: "acme~2", Endpoint: "POST /x", Key: "y"},
	}
	for _, sc := range scopes {
		a := attempt("", 100)
		a.Scope = sc
		if out, err := s.Charge(ctx, a); err != nil || out.Replayed {
			t.Fatalf("%+v: %v replayed=%v, want a charge of its own", sc, err, out.Replayed)
		}
	}
	for _, sc := range scopes {
		k, err := s.Lookup(ctx, sc)
		if err != nil || k.State != lab.KeyCompleted || k.Tenant != sc.Tenant || k.Key != sc.Key {
			t.Fatalf("lookup of %+v: %+v (%v)", sc, k, err)
		}
	}
	if n := s.Len(); n != len(scopes) {
		t.Fatalf("the store holds %d keys, want %d", n, len(scopes))
	}
}

// TestFingerprintsCompareAsStrings: the store keeps a hex fingerprint as
// bytes, and still tells apart what differs as text (case included) and
// matches what is equal, hex or not.
func TestFingerprintsCompareAsStrings(t *testing.T) {
	t.Parallel()
	s := newStore(t, memory.Config{})
	ctx := context.Background()
	charge := func(key, fp string) error {
		a := attempt(key, 100)
		a.Fingerprint = fp
		_, err := s.Charge(ctx, a)
		return err
	}
	hex := attempt("", 100).Fingerprint
	for key, second := range map[string]string{"k-case": strings.ToUpper(hex), "k-text": "not hex"} {
		if err := charge(key, hex); err != nil {
			t.Fatal(err)
		}
		if err := charge(key, second); !errors.Is(err, lab.ErrKeyReused) {
			t.Fatalf("%s: fingerprint %q after %q: %v, want ErrKeyReused", key, second, hex, err)
		}
	}
	if err := charge("k-opaque", "opaque"); err != nil {
		t.Fatal(err)
	}
	if err := charge("k-opaque", "opaque"); err != nil {
		t.Fatalf("the same non-hex fingerprint again: %v, want a replay", err)
	}
	if k, _ := s.Lookup(ctx, attempt("k-case", 100).Scope); k.Fingerprint != hex {
		t.Fatalf("lookup shows fingerprint %q, want %q", k.Fingerprint, hex)
	}
}

// TestOldestInFlight: the gauge reads the age of the oldest claim whose
// owner still works; completed and unsettled keys are not in flight.
func TestOldestInFlight(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := labtest.NewClock(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
		failures := new(atomic.Int32)
		failures.Store(3)
		s := newStore(t, memory.Config{Now: c.Now, Ledger: labtest.LostCommit{Ledger: inmem.NewBooks(c.Now), Failures: failures}})
		bg := context.Background()
		if _, err := s.Charge(bg, attempt("k-unsettled", 100)); !errors.Is(err, lab.ErrOutcomeUnknown) {
			t.Fatalf("unsettled: %v", err)
		}
		ctx, cancel := context.WithCancel(bg)
		done := make(chan error, 1)
		go func() {
			slow := attempt("k-slow", 100)
			slow.Faults = lab.Faults{Point: lab.FaultSlow, Work: time.Hour}
			_, err := s.Charge(ctx, slow)
			done <- err
		}()
		synctest.Wait() // the slow owner holds its claim
		c.Advance(30 * time.Second)
		if _, err := s.Charge(bg, attempt("k-done", 100)); err != nil {
			t.Fatal(err)
		}
		c.Advance(10 * time.Second)
		if age, _ := s.OldestInFlight(bg); age != 40*time.Second {
			t.Fatalf("oldest in flight: %s, want the slow claim's 40s", age)
		}
		cancel() // the slow owner's client leaves: its claim is released
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("slow owner: %v", err)
		}
		if age, _ := s.OldestInFlight(bg); age != 0 {
			t.Fatalf("oldest in flight: %s, want none", age)
		}
	})
}

// TestConfinedCrashForgetsOnlyItsKeys: a crash confined to a key prefix (a
// matrix cell's) forgets the namespace's keys under it and no other: the
// caller's own key still replays.
func TestConfinedCrashForgetsOnlyItsKeys(t *testing.T) {
	t.Parallel()
	s := newStore(t, memory.Config{})
	ctx := context.Background()
	for _, key := range []string{"mine-1", "matrix-b1-done"} {
		if _, err := s.Charge(ctx, attempt(key, 100)); err != nil {
			t.Fatal(err)
		}
	}
	crash := attempt("matrix-b1-crash", 100)
	crash.Faults = lab.Faults{Point: lab.FaultCrashAfterCharge, Confine: "matrix-b1-"}
	if _, err := s.Charge(ctx, crash); !errors.Is(err, lab.ErrCrash) {
		t.Fatalf("crash: %v", err)
	}
	for key, want := range map[string]string{"mine-1": lab.KeyCompleted, "matrix-b1-done": lab.KeyAbsent, "matrix-b1-crash": lab.KeyAbsent} {
		if k, err := s.Lookup(ctx, attempt(key, 100).Scope); err != nil || k.State != want {
			t.Errorf("%s after the confined crash: %s (%v), want %s", key, k.State, err, want)
		}
	}
	if out, err := s.Charge(ctx, attempt("mine-1", 100)); err != nil || !out.Replayed {
		t.Fatalf("the caller's key after the crash: replayed %v, %v", out.Replayed, err)
	}
	// Unconfined, a crash forgets the namespace's every key, as a dying process would.
	crash.Faults.Confine = ""
	if _, err := s.Charge(ctx, crash); !errors.Is(err, lab.ErrCrash) {
		t.Fatalf("crash: %v", err)
	}
	if k, _ := s.Lookup(ctx, attempt("mine-1", 100).Scope); k.State != lab.KeyAbsent {
		t.Fatalf("mine-1 after an unconfined crash: %s", k.State)
	}
}
