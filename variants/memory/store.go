// Package memory is the design that holds on one replica: idempotency keys
// in a map in the process heap, claimed under a mutex.
//
// This file is the design, and the path every attempt takes: a first
// attempt claims its key, charges, and completes the key with its response;
// a retry finds the key and replays that response, or waits for its twin. forget.go is what a
// crash, a restart and the key window take away, state.go what
// /idempotency/state shows, twin_wait.go a twin's bounded wait, stepping.go
// what a stepped run reads and moves.
package memory

import (
	"context"
	"errors"
	"fmt"
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

	mu      sync.Mutex
	entries map[lab.Scope]*entry // (namespace, tenant, endpoint, key): one tenant's key is never another's
	claims  uint64               // claims so far: orders the keys claimed at one instant
	expiry  expiryHeap           // settled entries by expiry, evicted as claims go by
	holders map[*entry]string    // the stepped attempt that claimed an entry (stepping.go)
}

// entry is one key, from its claim to its eviction.
type entry struct {
	scope       lab.Scope
	fingerprint string // the request's: the same key with another payload is refused
	state       keyState
	// done is closed when the owner settles the entry, gives up, or dies
	// in a crash: twins wait on it.
	done      chan struct{}
	chargeID  string // the charge this key may apply; kept across an unknown outcome
	inherited bool   // chargeID came from an unsettled entry: never give it up
	resp      lab.Response
	createdAt time.Time
	expiresAt time.Time // set once settled
	order     uint64    // the store's claim count when claimed: a take-over keeps it
}

// keyState is where an entry stands.
type keyState uint8

const (
	inFlight  keyState = iota // claimed: its owner works
	completed                 // resp holds the response
	unsettled                 // the charge's outcome is unknown: a retry of the same request retries its charge id
	crashed                   // the replica crashed under its owner; no longer in the map
)

// Config configures a memory store; every field is required.
type Config struct {
	Ledger lab.Ledger
	Window time.Duration // retention of completed keys
	Wait   time.Duration // bounded wait for an in-flight twin
	Now    lab.Clock
}

func (cfg Config) check() error {
	switch {
	case cfg.Ledger == nil || cfg.Now == nil:
		return errors.New("memory: ledger and clock are required")
	case cfg.Window <= 0 || cfg.Wait <= 0:
		return fmt.Errorf("memory: window and wait must be positive (got %s, %s)", cfg.Window, cfg.Wait)
	}
	return nil
}

// New returns an empty memory store.
func New(cfg Config) (*Store, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return &Store{ledger: cfg.Ledger, window: cfg.Window, wait: cfg.Wait, now: cfg.Now, entries: map[lab.Scope]*entry{}}, nil
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// Charge claims the key or waits for its twin, then charges at most once per replica.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	var wait twinWait // started by the first wait: a first attempt or a replay needs none
	defer wait.end()
	for {
		if err := lab.Pause(ctx, lab.PointBeforeClaim); err != nil {
			return lab.Outcome{}, err
		}
		e, state, claimed := s.claim(a)
		switch {
		case claimed:
			return s.perform(ctx, e, a)
		case e.fingerprint != a.Fingerprint:
			return lab.Outcome{}, lab.ErrKeyReused
		case state == completed: // its response never changes: replay it
			lab.Mark(ctx, lab.PhaseReplay)
			return lab.Outcome{Response: e.resp, Replayed: true}, nil
		}
		select {
		case <-e.done:
			// What the owner set before closing done stays: read it.
			switch e.state {
			case crashed:
				return lab.Outcome{}, lab.ErrCrash // the replica died under this request too
			case completed:
				lab.Mark(ctx, lab.PhaseReplay)
				return lab.Outcome{Response: e.resp, Replayed: true}, nil
			}
			// The first request gave up and released the key, or its
			// outcome is unknown: compete again.
		case <-wait.done(ctx, s.wait): // ran out, a "wait" move ended it, or the caller left
			return lab.Outcome{}, waitOver(ctx)
		}
	}
}

// claim returns the live entry of the attempt's scope, creating it
// (claimed=true) when absent or expired, or taking over one whose outcome is
// unknown with its charge id. Another request's entry comes with its state
// as the lock saw it: its owner may settle it as soon as the lock is free.
func (s *Store) claim(a lab.Attempt) (e *entry, state keyState, claimed bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked(now, 2) // amortised eviction keeps the table bounded without a sweeper
	old := s.entries[a.Scope]
	var taken *entry // an unsettled entry of the same request, whose charge this claim retries
	if old != nil {
		switch {
		case old.state != inFlight && !now.Before(old.expiresAt):
			// Past its retention: forgotten like any expired key.
		case old.state == unsettled && old.fingerprint == a.Fingerprint:
			// Retry the same charge: if the lost commit landed, the ledger
			// returns it instead of charging again.
			taken = old
		default:
			return old, old.state, false
		}
	}
	e = &entry{scope: a.Scope, fingerprint: a.Fingerprint, done: make(chan struct{}), createdAt: now}
	if taken != nil {
		e.chargeID, e.inherited, e.createdAt, e.order = taken.chargeID, true, taken.createdAt, taken.order
	} else {
		s.claims++
		e.chargeID, e.order = lab.NewChargeID(), s.claims
	}
	s.entries[a.Scope] = e
	return e, inFlight, true
}

// perform charges on the owner's claim, then completes the key with the
// response, or releases it when nothing was charged.
func (s *Store) perform(ctx context.Context, e *entry, a lab.Attempt) (lab.Outcome, error) {
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		s.crash(lab.CrashRegion(a))
		return lab.Outcome{}, lab.ErrCrash
	}
	lab.Mark(ctx, lab.PhaseClaim)
	s.hold(ctx, e)
	if err := lab.Pause(ctx, lab.PointAfterClaim); err != nil {
		s.giveUp(e, a) // nothing was charged by this attempt
		return lab.Outcome{}, err
	}
	a.ChargeID = e.chargeID
	resp, err := lab.Perform(ctx, s.ledger, a, s.now())
	if errors.Is(err, lab.ErrOutcomeUnknown) || err != nil && e.inherited {
		// Maybe charged (now, or by the lost commit whose id this entry
		// carries): keep the key and its charge id for the next attempt.
		s.settle(e, unsettled, lab.Response{}, a)
		return lab.Outcome{}, err
	}
	if err != nil {
		s.release(e) // nothing was charged
		return lab.Outcome{}, err
	}
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		s.crash(lab.CrashRegion(a))
		return lab.Outcome{}, lab.ErrCrash
	}
	// Charged: whatever ends the wait, the key completes with the response.
	pauseErr := lab.Pause(ctx, lab.PointAfterCharge)
	// Marked before settle shows the response to twins: they replay it only after.
	lab.Mark(ctx, lab.PhaseCommit)
	if !s.settle(e, completed, resp, a) { // the replica "died" meanwhile: this request dies with it
		return lab.Outcome{}, lab.ErrCrash
	}
	if pauseErr != nil {
		return lab.Outcome{}, pauseErr
	}
	return lab.Outcome{Response: resp}, nil
}

// settle records that e's owner no longer works on it: completed with its
// response, or unsettled; either way it expires after the window. It
// reports false when a crash took e first.
func (s *Store) settle(e *entry, state keyState, resp lab.Response, a lab.Attempt) bool {
	retention := a.Faults.RetentionOr(s.window)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.state == crashed {
		return false
	}
	e.state, e.resp, e.expiresAt = state, resp, s.now().Add(retention)
	if s.entries[e.scope] == e { // not forgotten by a restart meanwhile
		s.expiry.push(e)
	}
	close(e.done)
	return true
}

// giveUp ends a claim left before its charge; an inherited charge id is kept.
func (s *Store) giveUp(e *entry, a lab.Attempt) {
	if e.inherited {
		s.settle(e, unsettled, lab.Response{}, a)
		return
	}
	s.release(e)
}

// release forgets a claim whose work failed before anything was charged, so
// a retry may run it again.
func (s *Store) release(e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.entries[e.scope] == e {
		delete(s.entries, e.scope)
	}
	if e.state != crashed { // a crash closed it
		close(e.done)
	}
}
