// Package lookfirst is the smallest design that reads the key, and the
// first lesson after none at all: look the key up; if it is absent, charge,
// then record the answer under it. The look and the write are two steps,
// so attempts that overlap all look before any has written, all find
// nothing, and all charge: the check-then-act race, in plain sight.
package lookfirst

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Name is the variant's name in the lab.
const Name lab.StoreName = "look-first"

// Window is the time between the look and the write. A real server spends
// it charging, a few milliseconds, and whether twins overlap is then luck;
// the lab makes it wide, so that attempts released together always overlap
// and the race's outcome is certain (the README's matrix is pinned by a
// test).
const Window = 100 * time.Millisecond

// Store keeps each key's answer in a map in this replica's heap.
type Store struct {
	ledger lab.Ledger
	now    lab.Clock
	window time.Duration // how long an answer is kept

	mu   sync.Mutex
	seen map[lab.Scope]answer
}

// answer is what the store recorded for a key.
type answer struct {
	fingerprint string
	resp        lab.Response
	expires     time.Time
}

// New returns an empty store.
func New(ledger lab.Ledger, now lab.Clock, window time.Duration) (*Store, error) {
	if ledger == nil || now == nil || window <= 0 {
		return nil, errors.New("lookfirst: ledger, clock and a positive window are required")
	}
	return &Store{ledger: ledger, now: now, window: window, seen: map[lab.Scope]answer{}}, nil
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// Charge looks, then acts.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	if err := lab.Pause(ctx, lab.PointBeforeClaim); err != nil {
		return lab.Outcome{}, err
	}
	if ans, ok := s.look(a.Scope); ok {
		if ans.fingerprint != a.Fingerprint {
			return lab.Outcome{}, lab.ErrKeyReused
		}
		lab.Mark(ctx, lab.PhaseReplay)
		return lab.Outcome{Response: ans.resp, Replayed: true}, nil
	}
	// Absent. Nothing says so to anyone else: until the write below, every
	// twin that looks finds nothing too.
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		s.forget(lab.CrashRegion(a)) // the process dies, and its heap with it
		return lab.Outcome{}, lab.ErrCrash
	}
	if err := lab.Pause(ctx, lab.PointAfterClaim); err != nil {
		return lab.Outcome{}, err
	}
	// A stepped attempt's schedule decides the overlap; any other waits
	// the Window, so that twins released together overlap for certain.
	if !lab.Stepped(ctx) {
		if err := lab.Sleep(ctx, Window); err != nil {
			return lab.Outcome{}, fmt.Errorf("error waiting between the look and the charge: %w", err)
		}
	}
	resp, err := lab.Perform(ctx, s.ledger, a, s.now())
	if err != nil {
		return lab.Outcome{}, err
	}
	// Charged; if the stepped run ends here the answer is never recorded,
	// as for a crash between the charge and the write.
	if err := lab.Pause(ctx, lab.PointAfterCharge); err != nil {
		return lab.Outcome{}, err
	}
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		s.forget(lab.CrashRegion(a)) // charged, never recorded
		return lab.Outcome{}, lab.ErrCrash
	}
	lab.Mark(ctx, lab.PhaseCommit) // before the answer is there for a twin to look up
	s.mu.Lock()
	s.seen[a.Scope] = answer{a.Fingerprint, resp, s.now().Add(a.Faults.RetentionOr(s.window))}
	s.mu.Unlock()
	return lab.Outcome{Response: resp}, nil
}

// look finds the key's answer, unless its retention is over.
func (s *Store) look(sc lab.Scope) (answer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ans, ok := s.seen[sc]
	if ok && !s.now().Before(ans.expires) {
		delete(s.seen, sc)
		return answer{}, false
	}
	return ans, ok
}

// forget drops the region's answers.
func (s *Store) forget(r lab.Region) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sc := range s.seen {
		if r.Covers(sc) {
			delete(s.seen, sc)
		}
	}
}

// Restart forgets the region's answers, as a process restart does.
func (s *Store) Restart(_ context.Context, r lab.Region) error {
	s.forget(r)
	return nil
}

// Reset forgets the namespace's answers ("" for every answer).
func (s *Store) Reset(_ context.Context, ns lab.Namespace) error {
	s.forget(lab.Region{Namespace: ns})
	return nil
}

// Lookup reports one key: absent, or completed with its answer.
func (s *Store) Lookup(_ context.Context, sc lab.Scope) (lab.KeyState, error) {
	k := lab.KeyState{Tenant: sc.Tenant, Key: sc.Key, State: lab.KeyAbsent}
	if ans, ok := s.look(sc); ok {
		k.State, k.Fingerprint, k.ExpiresAt = lab.KeyCompleted, ans.fingerprint, ans.expires.UTC()
		k.Status, k.Response = ans.resp.Status, ans.resp.Body
	}
	return k, nil
}
