package labtest

import (
	"context"
	"sync"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

// OneLockName is the toy variant's name.
const OneLockName lab.StoreName = "one-lock"

// OneLock is a toy variant, not built in, that tests register beside the
// built-in ones to show that a design needs no other change: one lock held
// around the whole charge, so on one replica every retry finds its first
// attempt's answer, and every charge of the replica waits for the one
// before.
func OneLock() variant.Variant {
	return variant.Variant{
		Name: OneLockName, Label: "one lock around the charge", RequiresKey: true, Effects: "outbox",
		Crash:   variant.CrashWipesHeap,
		Decides: "takes one lock, looks the key up, charges when absent, records, lets go",
		Keys:    "a map in this replica's heap, under the lock that serialises every charge",
		Open: func(_ context.Context, d variant.Deps) (lab.Store, error) {
			return &oneLock{ledger: d.Ledger, now: d.Clock, seen: map[lab.Scope]oneLockAnswer{}}, nil
		},
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries: {Usual: lab.Holds, Holds: "the lock let one attempt at a time look and charge: the first charged, the others replayed",
				Breaks: "the lock did not stop a duplicate"},
		},
	}
}

type oneLockAnswer struct {
	fingerprint string
	resp        lab.Response
}

type oneLock struct {
	ledger lab.Ledger
	now    lab.Clock
	mu     sync.Mutex
	seen   map[lab.Scope]oneLockAnswer
}

func (s *oneLock) Name() lab.StoreName { return OneLockName }

func (s *oneLock) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ans, ok := s.seen[a.Scope]; ok {
		if ans.fingerprint != a.Fingerprint {
			return lab.Outcome{}, lab.ErrKeyReused
		}
		return lab.Outcome{Response: ans.resp, Replayed: true}, nil
	}
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		clear(s.seen) // the toy's process dies with its heap
		return lab.Outcome{}, lab.ErrCrash
	}
	resp, err := lab.Perform(ctx, s.ledger, a, s.now())
	if err != nil {
		return lab.Outcome{}, err
	}
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		clear(s.seen)
		return lab.Outcome{}, lab.ErrCrash
	}
	s.seen[a.Scope] = oneLockAnswer{a.Fingerprint, resp}
	return lab.Outcome{Response: resp}, nil
}
