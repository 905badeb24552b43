// Package memory is the design that holds on one replica: idempotency keys
// in a map in the process heap, claimed under a mutex.
package memory

import (
	"cmp"
	"container/heap"
	"container/list"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Store keeps idempotency keys in a map in this process's heap. The claim is
// one atomic step under a mutex, which is right for one replica and wrong for
// two: each replica has its own map.
type Store struct {
	ledger lab.Ledger
	window time.Duration // how long completed keys are kept
	wait   time.Duration // bound on waiting for an in-flight twin
	now    lab.Clock

	mu sync.Mutex
	// parts holds each namespace's keys apart, so a crash or a restart
	// one attendee injects forgets their keys and nobody else's.
	parts  map[lab.Namespace]*part
	expiry expiryHeap // every part's completed entries; stale ones are skipped
}

// part is one namespace's keys, and the order they were claimed in, so
// listing the newest costs what is listed, not what is held.
type part struct {
	entries map[string]*entry
	order   list.List // of *entry, oldest claim first
}

type entry struct {
	scope       lab.Scope
	fingerprint string
	done        chan struct{} // closed when the first request completes or gives up
	resp        *lab.Response // set before done is closed when completed
	crashed     bool          // set before done is closed when the replica crashed
	unknown     bool          // set before done is closed when the charge's outcome is unknown
	chargeID    string        // the charge this key may apply; kept across an unknown outcome
	inherited   bool          // chargeID came from an unsettled entry: never give it up
	createdAt   time.Time
	expiresAt   time.Time
	elem        *list.Element // in its part's order
}

// Config configures a memory Store; every field is required.
type Config struct {
	Ledger lab.Ledger
	Window time.Duration // retention of completed keys
	Wait   time.Duration // bounded wait for an in-flight twin
	Now    lab.Clock
}

// New returns an empty memory store.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.Ledger == nil || cfg.Now == nil:
		return nil, errors.New("memory: ledger and clock are required")
	case cfg.Window <= 0 || cfg.Wait <= 0:
		return nil, fmt.Errorf("memory: window and wait must be positive (got %s, %s)", cfg.Window, cfg.Wait)
	}
	return &Store{ledger: cfg.Ledger, window: cfg.Window, wait: cfg.Wait, now: cfg.Now, parts: map[lab.Namespace]*part{}}, nil
}

// getLocked finds the entry of a scope.
func (s *Store) getLocked(sc lab.Scope) (*entry, bool) {
	p := s.parts[lab.NamespaceOf(sc.Tenant)]
	if p == nil {
		return nil, false
	}
	e, ok := p.entries[sc.String()]
	return e, ok
}

// putLocked stores e under its scope, in place of any entry it had.
func (s *Store) putLocked(e *entry) {
	ns := lab.NamespaceOf(e.scope.Tenant)
	p := s.parts[ns]
	if p == nil {
		p = &part{entries: map[string]*entry{}}
		s.parts[ns] = p
	}
	k := e.scope.String()
	if old, ok := p.entries[k]; ok {
		p.order.Remove(old.elem)
	}
	p.entries[k] = e
	e.elem = p.order.PushBack(e)
}

// holdsLocked reports whether e is still the entry of its scope (not
// replaced, evicted or forgotten by a crash or restart).
func (s *Store) holdsLocked(e *entry) bool {
	cur, ok := s.getLocked(e.scope)
	return ok && cur == e
}

// deleteLocked forgets e, if it is still the entry of its scope.
func (s *Store) deleteLocked(e *entry) {
	if !s.holdsLocked(e) {
		return
	}
	ns := lab.NamespaceOf(e.scope.Tenant)
	p := s.parts[ns]
	delete(p.entries, e.scope.String())
	p.order.Remove(e.elem)
	if len(p.entries) == 0 {
		delete(s.parts, ns)
	}
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// Charge claims the key or waits for its twin, then charges at most once per replica.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	deadline := time.NewTimer(s.wait)
	defer deadline.Stop()
	for {
		e, claimed := s.claim(a)
		if claimed {
			return s.perform(ctx, e, a)
		}
		if e.fingerprint != a.Fingerprint {
			return lab.Outcome{}, lab.ErrKeyReused
		}
		select {
		case <-e.done:
			if e.crashed {
				return lab.Outcome{}, lab.ErrCrash // the replica died under this request too
			}
			if e.resp != nil {
				return lab.Outcome{Response: *e.resp, Replayed: true}, nil
			}
			// The first request gave up and released the key: compete again.
		case <-deadline.C:
			return lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
		case <-ctx.Done():
			return lab.Outcome{}, ctx.Err()
		}
	}
}

// claim returns the live entry of the attempt's scope, creating it (claimed=true) when absent
// or expired, or taking over one whose outcome is unknown with its charge id.
func (s *Store) claim(a lab.Attempt) (*entry, bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked(now, 2) // amortised eviction keeps the table bounded without a sweeper
	e := &entry{scope: a.Scope, fingerprint: a.Fingerprint, done: make(chan struct{}), createdAt: now, chargeID: lab.NewChargeID()}
	if old, ok := s.getLocked(a.Scope); ok {
		switch {
		case old.unknown && !now.Before(old.expiresAt):
			// Unsettled past its retention: forgotten like any expired key.
		case old.unknown && old.fingerprint == a.Fingerprint:
			// Retry the same charge: if the lost commit landed, the ledger
			// returns it instead of charging again.
			e.chargeID, e.createdAt, e.inherited = old.chargeID, old.createdAt, true
		case old.resp == nil || now.Before(old.expiresAt):
			return old, false
		}
	}
	s.putLocked(e)
	return e, true
}

func (s *Store) perform(ctx context.Context, e *entry, a lab.Attempt) (lab.Outcome, error) {
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		s.crash(lab.NamespaceOf(a.Scope.Tenant))
		return lab.Outcome{}, lab.ErrCrash
	}
	lab.Mark(ctx, lab.PhaseClaim)
	a.ChargeID = e.chargeID
	resp, err := lab.Perform(ctx, s.ledger, a, s.now())
	if errors.Is(err, lab.ErrOutcomeUnknown) || err != nil && e.inherited {
		// Maybe charged (now, or by the lost commit whose id this entry
		// carries): keep the key and its charge id for the next attempt.
		s.settleLater(e, a)
		return lab.Outcome{}, err
	}
	if err != nil {
		s.release(e) // nothing was charged
		return lab.Outcome{}, err
	}
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		s.crash(lab.NamespaceOf(a.Scope.Tenant))
		return lab.Outcome{}, lab.ErrCrash
	}
	retention := a.Faults.RetentionOr(s.window)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.crashed { // the replica "died" meanwhile: this request dies with it
		return lab.Outcome{}, lab.ErrCrash
	}
	e.resp = &resp
	e.expiresAt = s.now().Add(retention)
	if s.holdsLocked(e) { // not forgotten by a restart meanwhile
		heap.Push(&s.expiry, e)
	}
	close(e.done)
	return lab.Outcome{Response: resp}, nil
}

// release forgets a claim whose work failed before anything was charged, so
// a retry may run it again.
func (s *Store) release(e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleteLocked(e)
	if !e.crashed {
		close(e.done)
	}
}

// settleLater keeps an entry whose charge may have been applied: the next
// attempt with the same request retries the same charge id.
func (s *Store) settleLater(e *entry, a lab.Attempt) {
	retention := a.Faults.RetentionOr(s.window)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.crashed {
		return
	}
	e.unknown = true
	e.expiresAt = s.now().Add(retention) // kept no longer than a completed key
	if s.holdsLocked(e) {
		heap.Push(&s.expiry, e)
	}
	close(e.done)
}

// crash loses the namespace's keys, as the death of this replica's process
// would lose them all, and takes down the requests waiting on them: their
// connections die too. Other namespaces keep theirs: one attendee's crash
// is not another's.
func (s *Store) crash(ns lab.Namespace) {
	s.mu.Lock()
	var inFlight []*entry
	for _, e := range s.parts[ns].entriesOrNil() {
		if e.resp == nil && !e.unknown {
			e.crashed = true
			inFlight = append(inFlight, e)
		}
	}
	delete(s.parts, ns)
	s.mu.Unlock()
	for _, e := range inFlight {
		close(e.done)
	}
}

// Restart forgets the namespace's keys ("" for every key), as a process
// restart does.
func (s *Store) Restart(_ context.Context, ns lab.Namespace) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ns == "" {
		s.parts, s.expiry = map[lab.Namespace]*part{}, nil
		return nil
	}
	delete(s.parts, ns)
	return nil
}

// Reset forgets the namespace's keys ("" for every key).
func (s *Store) Reset(ctx context.Context, ns lab.Namespace) error { return s.Restart(ctx, ns) }

// Sweep evicts every expired key.
func (s *Store) Sweep(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.evictLocked(s.now(), -1), nil
}

// evictLocked removes up to max expired entries (all when max < 0).
func (s *Store) evictLocked(now time.Time, max int) int {
	n := 0
	for len(s.expiry) > 0 && n != max && !now.Before(s.expiry[0].expiresAt) {
		e := heap.Pop(&s.expiry).(*entry)
		if s.holdsLocked(e) {
			s.deleteLocked(e)
			n++
		}
	}
	return n
}

// Len reports how many keys the store holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.parts {
		n += len(p.entries)
	}
	return n
}

// Lookup reports the state of one key.
func (s *Store) Lookup(_ context.Context, sc lab.Scope) (lab.KeyState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e, ok := s.getLocked(sc)
	if !ok || ((e.resp != nil || e.unknown) && !now.Before(e.expiresAt)) {
		return lab.KeyState{Tenant: sc.Tenant, Key: sc.Key, State: lab.KeyAbsent}, nil
	}
	ks := e.state(now)
	if e.resp != nil {
		ks.Response = e.resp.Body
	}
	return ks, nil
}

// state is the entry as /idempotency/state shows it; the caller holds s.mu.
func (e *entry) state(now time.Time) lab.KeyState {
	ks := lab.KeyState{
		Tenant: e.scope.Tenant, Key: e.scope.Key, State: lab.KeyInFlight, Fingerprint: e.fingerprint,
		CreatedAt: e.createdAt.UTC(), AgeMS: now.Sub(e.createdAt).Milliseconds(),
	}
	if e.resp != nil {
		ks.State, ks.Status, ks.ExpiresAt = lab.KeyCompleted, e.resp.Status, e.expiresAt.UTC()
	}
	return ks
}

// Keys lists the namespace's newest keys ("" for every namespace's). It
// holds the lock for the keys it lists, never for all the store holds.
func (s *Store) Keys(_ context.Context, ns lab.Namespace, limit int) ([]lab.KeyState, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var out []lab.KeyState
	total := 0
	for name, p := range s.parts {
		if ns != "" && name != ns {
			continue
		}
		total += len(p.entries)
		for el, n := p.order.Back(), 0; el != nil && n < limit; el, n = el.Prev(), n+1 {
			out = append(out, el.Value.(*entry).state(now))
		}
	}
	// Each part gave its newest in claim order; across parts (the admin's
	// view) keep the newest overall.
	slices.SortStableFunc(out, func(x, y lab.KeyState) int { return y.CreatedAt.Compare(x.CreatedAt) })
	return out[:min(limit, len(out))], total, nil
}

// entriesOrNil is the part's keys, none for a namespace without a part.
func (p *part) entriesOrNil() map[string]*entry {
	if p == nil {
		return nil
	}
	return p.entries
}

// expiryHeap orders completed entries by expiry.
type expiryHeap []*entry

func (h expiryHeap) Len() int { return len(h) }
func (h expiryHeap) Less(i, j int) bool {
	return cmp.Less(h[i].expiresAt.UnixNano(), h[j].expiresAt.UnixNano())
}
func (h expiryHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)   { *h = append(*h, x.(*entry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// OldestInFlight reports the age of the oldest key claimed and not yet
// completed: a slow worker, or a crashed one whose claim nobody settled.
func (s *Store) OldestInFlight(context.Context) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var oldest time.Duration
	for _, p := range s.parts {
		for el := p.order.Front(); el != nil; el = el.Next() {
			if e := el.Value.(*entry); e.resp == nil && !e.unknown {
				oldest = max(oldest, now.Sub(e.createdAt))
				break // claims are in order: the first in flight is this part's oldest
			}
		}
	}
	return oldest, nil
}
