package lab

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// waitersOn reports how many attempts wait on key.
func (w *Wakeups) waitersOn(key string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e := w.waiting[key]; e != nil {
		return e.waiters
	}
	return 0
}

// TestSettledWakesEveryWaiterOfThatKeyOnly parks waiters for an hour on two
// keys: settling one key returns its waiters at once and leaves the other's
// waiting; once every waiter is gone the map is empty.
//
// It runs in a synctest bubble: synctest.Wait returns once every waiter is
// parked, so the test needs no polling to know they are.
func TestSettledWakesEveryWaiterOfThatKeyOnly(t *testing.T) {
	t.Parallel()
	synctest.Test(t, settleOneKey)
}

func settleOneKey(t *testing.T) {
	var w Wakeups
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	woken := make(chan string, 8)
	for _, key := range []string{"a", "a", "a", "b"} {
		wg.Go(func() {
			err := w.Wait(ctx, key, time.Hour)
			if err == nil {
				woken <- key
			}
		})
	}
	synctest.Wait()
	if a, b := w.waitersOn("a"), w.waitersOn("b"); a != 3 || b != 1 {
		t.Fatalf("%d waiters on a and %d on b, want 3 and 1", a, b)
	}
	w.Settled("a")
	for range 3 {
		if k := <-woken; k != "a" {
			t.Fatalf("settling a woke a waiter on %s", k)
		}
	}
	if n := w.waitersOn("b"); n != 1 {
		t.Fatalf("%d waiters on b, want 1 still waiting", n)
	}
	cancel() // b's waiter leaves with the context's error
	wg.Wait()
	select {
	case k := <-woken:
		t.Fatalf("a cancelled waiter on %s reported a wake-up", k)
	default:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waiting) != 0 {
		t.Fatalf("%d keys left in the map after every waiter left", len(w.waiting))
	}
}

// TestWaitEndsAtItsPollWhenNobodySettles: a twin in another process never
// settles here; the waiter polls again after d.
func TestWaitEndsAtItsPollWhenNobodySettles(t *testing.T) {
	t.Parallel()
	var w Wakeups
	if err := w.Wait(context.Background(), "k", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	w.Settled("k") // settling a key nobody waits on is a no-op
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Wait(ctx, "k", time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait returned %v", err)
	}
}
