package memory

// The claim, the charge, the completion and the replay of store.go over
// packed entries (packed.go): the same decision, the same order.

import (
	"container/heap"
	"context"
	"crypto/sha256"
	"errors"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Name is the store's name.
func (s *Packed) Name() lab.StoreName { return Name }

// Charge claims the key or waits for its twin, then charges at most once per replica.
func (s *Packed) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	fp := fingerprintOf(a.Fingerprint)
	var wait twinWait // started by the first wait: a first attempt or a replay needs none
	defer wait.end()
	for {
		if err := lab.Pause(ctx, lab.PointBeforeClaim); err != nil {
			return lab.Outcome{}, err
		}
		e, done, claimed := s.claim(a, fp)
		switch {
		case claimed:
			return s.perform(ctx, e, a)
		case e.fingerprint != fp:
			return lab.Outcome{}, lab.ErrKeyReused
		case done == nil: // completed: its response never changes
			return lab.Outcome{Response: e.response(), Replayed: true}, nil
		}
		select {
		case <-done:
			// What the owner set before closing done stays: read it.
			switch e.state {
			case crashed:
				return lab.Outcome{}, lab.ErrCrash // the replica died under this request too
			case completed:
				return lab.Outcome{Response: e.response(), Replayed: true}, nil
			}
			// The first request gave up and released the key, or its
			// outcome is unknown: compete again.
		case <-wait.done(ctx, s.wait): // ran out, a "wait" move ended it, or the caller left
			return lab.Outcome{}, waitOver(ctx)
		}
	}
}

// claim returns the live entry of the attempt's scope, creating it (claimed=true) when absent
// or expired, or taking over one whose outcome is unknown with its charge id. When another
// request holds the entry, done is its claim's channel, read here under the lock because the
// claim is dropped when it completes; nil when the entry is settled.
func (s *Packed) claim(a lab.Attempt, fp [sha256.Size]byte) (e *packedEntry, done chan struct{}, claimed bool) {
	now := s.now()
	at := s.at(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked(at, 2) // amortised eviction keeps the table bounded without a sweeper
	old, p := s.getLocked(a.Scope)
	var unsettledSame *packedEntry // an unsettled entry of the same request, whose charge this claim retries
	if old != nil {
		switch {
		case old.state == unsettled && at >= old.expiresAt:
			// Unsettled past its retention: forgotten like any expired key.
		case old.state == unsettled && old.fingerprint == fp:
			// Retry the same charge: if the lost commit landed, the ledger
			// returns it instead of charging again.
			unsettledSame = old
		case old.state == inFlight:
			return old, old.claim.done, false
		case old.state == unsettled || at < old.expiresAt:
			return old, nil, false
		}
	}
	e = &packedEntry{fingerprint: fp, createdAt: at, claim: &claim{done: make(chan struct{})}}
	if unsettledSame != nil {
		e.claim.chargeID, e.createdAt, e.claim.inherited = unsettledSame.claim.chargeID, unsettledSame.createdAt, true
	} else {
		e.claim.chargeID = lab.NewChargeID()
	}
	if old != nil {
		e.id = old.id // the same scope: share its id
	} else {
		var buf [128]byte // built on the stack: the string is the one allocation
		e.id = string(appendScopeID(buf[:0], a.Scope))
	}
	s.putLocked(a.Scope.Namespace, p, old, e, unsettledSame != nil)
	return e, nil, true
}

func (s *Packed) perform(ctx context.Context, e *packedEntry, a lab.Attempt) (lab.Outcome, error) {
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		s.crash(lab.CrashRegion(a))
		return lab.Outcome{}, lab.ErrCrash
	}
	lab.Mark(ctx, lab.PhaseClaim)
	c := e.claim // the owner's until it settles the entry: nobody else changes it
	s.hold(ctx, e)
	if err := lab.Pause(ctx, lab.PointAfterClaim); err != nil {
		// Nothing charged by this attempt; an inherited charge id is kept.
		if c.inherited {
			s.settleLater(e, a)
		} else {
			s.release(e)
		}
		return lab.Outcome{}, err
	}
	a.ChargeID = c.chargeID
	resp, err := lab.Perform(ctx, s.ledger, a, s.now())
	if errors.Is(err, lab.ErrOutcomeUnknown) || err != nil && c.inherited {
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
		s.crash(lab.CrashRegion(a))
		return lab.Outcome{}, lab.ErrCrash
	}
	// Charged: whatever ends the wait, the key completes with the response.
	pauseErr := lab.Pause(ctx, lab.PointAfterCharge)
	retention := a.Faults.RetentionOr(s.window)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.state == crashed { // the replica "died" meanwhile: this request dies with it
		return lab.Outcome{}, lab.ErrCrash
	}
	e.body, e.status = resp.Body, resp.Status
	s.settleLocked(e, completed, retention)
	e.claim = nil // its charge id and channel are no longer needed
	if pauseErr != nil {
		return lab.Outcome{}, pauseErr
	}
	return lab.Outcome{Response: resp}, nil
}

// release forgets a claim whose work failed before anything was charged, so
// a retry may run it again.
func (s *Packed) release(e *packedEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleteLocked(e)
	if e.state != crashed { // a crash closed it
		close(e.claim.done)
	}
}

// settleLater keeps a packed entry whose charge may have been applied: the next
// attempt with the same request retries the same charge id.
func (s *Packed) settleLater(e *packedEntry, a lab.Attempt) {
	retention := a.Faults.RetentionOr(s.window)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.state == crashed {
		return
	}
	s.settleLocked(e, unsettled, retention) // kept no longer than a completed key
}

// settleLocked records that e's owner no longer works on it: completed or
// unsettled, e expires on its own.
func (s *Packed) settleLocked(e *packedEntry, state keyState, retention time.Duration) {
	e.state = state
	e.expiresAt = s.at(s.now().Add(retention))
	if p := s.heldLocked(e); p != nil { // not forgotten by a restart meanwhile
		delete(p.inFlight, e)
		heap.Push(&s.expiry, e)
	}
	close(e.claim.done)
	e.claim.done = nil
}
