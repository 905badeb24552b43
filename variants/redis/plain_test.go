package redis_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/variants/redis"
)

// TestPlainPathAnswersAlike: the plain path (SET NX then GET, twins that
// poll) and the optimised one (SET NX GET, wakeups) give the same answers and leave the same ledger, each on its own
// and with one writing a key and the other reading it, as replicas of
// either kind share one Redis.
func TestPlainPathAnswersAlike(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, url string) {
		books := inmem.NewBooks(time.Now)
		stores := map[bool]*redis.Store{true: storeOnPath(t, url, books, true), false: storeOnPath(t, url, books, false)}
		ctx := context.Background()
		for _, writer := range []bool{true, false} {
			for _, reader := range []bool{true, false} {
				w, r := stores[writer], stores[reader]
				key := fmt.Sprintf("k-plain-%v-%v", writer, reader)
				first, err := w.Charge(ctx, attempt(key, 2500, lab.Faults{}))
				if err != nil || first.Replayed || first.Response.Status != 201 {
					t.Fatalf("%s first: %+v %v; want a fresh 201", key, first, err)
				}
				again, err := r.Charge(ctx, attempt(key, 2500, lab.Faults{}))
				if err != nil || !again.Replayed || again.Response.Status != 201 || string(again.Response.Body) != string(first.Response.Body) {
					t.Fatalf("%s retry: %+v %v; want the first answer replayed byte for byte", key, again, err)
				}
				if _, err := r.Charge(ctx, attempt(key, 999, lab.Faults{})); !errors.Is(err, lab.ErrKeyReused) {
					t.Fatalf("%s with another amount: %v; want the key reused", key, err)
				}
				k, err := r.Lookup(ctx, attempt(key, 2500, lab.Faults{}).Scope)
				if err != nil || k.State != lab.KeyCompleted || k.Status != 201 || string(k.Response) != string(first.Response.Body) {
					t.Fatalf("%s looked up: %+v %v; want it completed with the first answer", key, k, err)
				}
				if tally, _ := books.KeyCharges(ctx, "acme", redis.Name, key); tally.Charges != 1 {
					t.Fatalf("%s: %d charges, want 1", key, tally.Charges)
				}

				held := key + "-held"
				if _, err := w.Charge(ctx, attempt(held, 2500, lab.Faults{Point: lab.FaultCrashAfterClaim})); !errors.Is(err, lab.ErrCrash) {
					t.Fatalf("%s crash after claim: %v", held, err)
				}
				var ip *lab.InProgressError
				if _, err := r.Charge(ctx, attempt(held, 2500, lab.Faults{})); !errors.As(err, &ip) {
					t.Fatalf("%s behind the stale claim: %v; want in progress", held, err)
				}
				if tally, _ := books.KeyCharges(ctx, "acme", redis.Name, held); tally.Charges != 0 {
					t.Fatalf("%s: %d charges, want none", held, tally.Charges)
				}
			}
		}
	})
}

// storeOnPath is a store on the plain path or the optimised one, under a
// key prefix shared by both.
func storeOnPath(t testing.TB, url string, books lab.Ledger, plain bool) *redis.Store {
	t.Helper()
	opts, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	client := goredis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	s, err := redis.New(redis.Config{Client: client, Ledger: books, Prefix: "lab-test-" + t.Name() + ":",
		Window: time.Hour, Wait: 50 * time.Millisecond, ClaimTTL: 30 * time.Second, Now: time.Now, Plain: plain})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Reset(context.Background(), "") })
	return s
}
