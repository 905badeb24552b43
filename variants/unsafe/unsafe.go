// Package unsafe is the design that does not decide: it ignores the key,
// charges every request and sends the receipt directly, outside any transaction.
package unsafe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Store charges every attempt.
type Store struct {
	ledger   lab.Ledger
	provider lab.Provider
	now      func() time.Time
}

// New returns the unsafe store.
func New(ledger lab.Ledger, provider lab.Provider, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{ledger: ledger, provider: provider, now: now}
}

// Name is the store's name.
func (s *Store) Name() string { return lab.StoreUnsafe }

// Describe says where the keys live.
func (s *Store) Describe() string { return "nowhere: the key is ignored" }

// Charge applies the charge, then sends the receipt directly: if the send
// fails the charge stays and its receipt never goes out.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		return lab.Outcome{}, lab.ErrCrash // nothing to claim: the crash happens before the charge
	}
	if err := a.Faults.Pause(ctx.Done()); err != nil {
		return lab.Outcome{}, err
	}
	entry := lab.NewEntry(a, s.now())
	c, err := s.ledger.Apply(ctx, lab.Apply{Entry: entry})
	var oc *lab.OrderConflictError
	if errors.As(err, &oc) {
		return lab.Outcome{Response: lab.OrderConflictResponse(oc)}, nil
	}
	if err != nil {
		return lab.Outcome{}, fmt.Errorf("error applying charge: %w", err)
	}
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		return lab.Outcome{}, lab.ErrCrash
	}
	if !a.Faults.Has(lab.FaultOutboxFail) { // the injected failure: the direct send is lost
		if _, err := s.provider.Deliver(ctx, *lab.NewReceiptEvent(entry), true); err != nil {
			return lab.Outcome{}, fmt.Errorf("error sending receipt: %w", err)
		}
	}
	return lab.Outcome{Response: lab.ChargeResponse(c)}, nil
}

// Keys: the unsafe store keeps none.
func (s *Store) Keys(context.Context, int) ([]lab.KeyState, int, error) { return nil, 0, nil }

// Lookup: the unsafe store keeps no key.
func (s *Store) Lookup(context.Context, lab.Scope) (string, error) { return lab.KeyAbsent, nil }

// Reset has nothing to forget.
func (s *Store) Reset(context.Context) error { return nil }

// Restart has nothing to lose.
func (s *Store) Restart(context.Context) error { return nil }

// Sweep has nothing to evict.
func (s *Store) Sweep(context.Context) (int, error) { return 0, nil }
