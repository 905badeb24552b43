package memory

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// What the Store shows of its keys: /idempotency/state and the
// oldest-in-flight gauge. Each reads the whole map under the lock.

// Len reports how many keys the store holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// Lookup reports the state of one key.
func (s *Store) Lookup(_ context.Context, sc lab.Scope) (lab.KeyState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e := s.entries[sc]
	if e == nil || e.state != inFlight && !now.Before(e.expiresAt) {
		return lab.KeyState{Tenant: sc.Tenant, Key: sc.Key, State: lab.KeyAbsent}, nil
	}
	ks := e.keyState(now)
	if e.state == completed {
		ks.Response = e.resp.Body
	}
	return ks, nil
}

// keyState is the entry as /idempotency/state shows it; the caller holds s.mu.
func (e *entry) keyState(now time.Time) lab.KeyState {
	ks := lab.KeyState{
		Tenant: e.scope.Tenant, Key: e.scope.Key, State: lab.KeyInFlight, Fingerprint: e.fingerprint,
		CreatedAt: e.createdAt.UTC(), AgeMS: now.Sub(e.createdAt).Milliseconds(),
	}
	if e.state == completed {
		ks.State, ks.Status, ks.ExpiresAt = lab.KeyCompleted, e.resp.Status, e.expiresAt.UTC()
	}
	return ks
}

// Keys lists the namespace's newest keys ("" for every namespace's). It
// keeps the newest limit as it reads the map, so the lock is held for one
// pass, not for a sort of every key held.
func (s *Store) Keys(_ context.Context, ns lab.Namespace, limit int) ([]lab.KeyState, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	newest, held := make([]*entry, 0, limit+1), 0
	for sc, e := range s.entries {
		if !ns.Includes(sc.Namespace) {
			continue
		}
		held++
		if i, _ := slices.BinarySearchFunc(newest, e, newerFirst); i < limit {
			newest = slices.Insert(newest, i, e)[:min(len(newest)+1, limit)]
		}
	}
	now := s.now()
	var out []lab.KeyState
	for _, e := range newest {
		out = append(out, e.keyState(now))
	}
	return out, held, nil
}

// newerFirst orders entries newest first; at one instant, the last claimed first.
func newerFirst(x, y *entry) int {
	return cmp.Or(y.createdAt.Compare(x.createdAt), cmp.Compare(y.order, x.order))
}

// OldestInFlight reports the age of the oldest key claimed and not yet
// completed: a slow worker, or a crashed one whose claim nobody settled.
func (s *Store) OldestInFlight(context.Context) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var oldest time.Duration
	for _, e := range s.entries {
		if e.state == inFlight {
			oldest = max(oldest, now.Sub(e.createdAt))
		}
	}
	return oldest, nil
}
