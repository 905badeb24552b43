// Package nokey is the design that does not decide (the "unsafe" store): it
// ignores the key, charges every request and sends the receipt directly,
// outside any transaction.
package nokey

import (
	"context"
	"errors"
	"fmt"

	"github.com/idempotency-lab/lab/lab"
)

// Name is the variant's name in the lab.
const Name lab.StoreName = "unsafe"

// Books is what the store charges and sends receipts with.
type Books interface {
	lab.Ledger
	lab.DirectSender
}

// Store charges every attempt.
type Store struct {
	books Books
	now   lab.Clock
}

// New returns the unsafe store.
func New(books Books, now lab.Clock) (*Store, error) {
	if books == nil || now == nil {
		return nil, errors.New("nokey: books and clock are required")
	}
	return &Store{books: books, now: now}, nil
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// Charge applies the charge, then sends the receipt directly: if the send
// fails the charge stays and its receipt never goes out.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		return lab.Outcome{}, lab.ErrCrash // nothing to claim: the crash happens before the charge
	}
	if err := a.Faults.Pause(ctx); err != nil {
		return lab.Outcome{}, err
	}
	entry := lab.NewEntry(a, s.now())
	c, err := s.books.Apply(ctx, lab.Apply{Entry: entry})
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
		if err := s.books.SendDirect(ctx, *lab.NewReceiptEvent(entry)); err != nil {
			return lab.Outcome{}, fmt.Errorf("error sending receipt: %w", err)
		}
	}
	return lab.Outcome{Response: lab.ChargeResponse(c)}, nil
}
