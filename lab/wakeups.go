package lab

import (
	"context"
	"sync"
	"time"
)

// Wakeups lets the attempts of one process that wait for a twin's claim
// look again as soon as a twin in this process settles it, instead of at
// their next poll. It is only a hint to look now: what they find is still
// read from the store, and twins in other processes are still seen by
// polling. The zero value is ready to use.
type Wakeups struct {
	mu      sync.Mutex
	waiting map[string]*wakeup
}

type wakeup struct {
	settled chan struct{}
	waiters int
}

// Wait returns when key is settled in this process, after d, or when ctx
// ends (with its error).
func (w *Wakeups) Wait(ctx context.Context, key string, d time.Duration) error {
	w.mu.Lock()
	if w.waiting == nil {
		w.waiting = map[string]*wakeup{}
	}
	e := w.waiting[key]
	if e == nil {
		e = &wakeup{settled: make(chan struct{})}
		w.waiting[key] = e
	}
	e.waiters++
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if e.waiters--; e.waiters == 0 && w.waiting[key] == e {
			delete(w.waiting, key) // nobody left to wake: the map holds only keys being waited on
		}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-e.settled:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Settled wakes every attempt of this process waiting on key.
func (w *Wakeups) Settled(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e := w.waiting[key]; e != nil {
		close(e.settled)
		delete(w.waiting, key)
	}
}
