// Package unsafestore is the design that does not decide (the "unsafe"
// store; the name unsafe belongs to Go itself): it
// ignores the key, charges every request and calls the provider directly,
// inline, with no outbox.
package unsafestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idempotency-lab/lab/lab"
)

// Name is the variant's name in the lab.
const Name lab.StoreName = "unsafe"

// Ledger is the ledger the store charges and the provider it calls
// inline, one value.
type Ledger interface {
	lab.Ledger
	lab.DirectSender
}

// Store charges every attempt.
type Store struct {
	books Ledger
	now   lab.Clock
	log   *slog.Logger
}

// New returns the unsafe store.
func New(books Ledger, now lab.Clock, log *slog.Logger) (*Store, error) {
	if books == nil || now == nil || log == nil {
		return nil, errors.New("unsafestore: books, clock and logger are required")
	}
	return &Store{books: books, now: now, log: log}, nil
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// Charge does what code without an outbox does: it calls the provider
// inline, in the middle of its write, and carries on whatever the call
// did. Both halves of the seed's lesson follow: when the send fails the
// charge stays and its capture and receipt never happen; when the write
// fails after the send (the outbox_fail fault: the write is rolled back)
// the provider was told of a charge that does not exist.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		return lab.Outcome{}, lab.ErrCrash // nothing to claim: the crash happens before the charge
	}
	if err := a.Faults.Pause(ctx); err != nil {
		return lab.Outcome{}, err
	}
	entry := lab.NewEntry(a, s.now())
	if err := s.books.SendDirect(ctx, *lab.NewReceiptEvent(entry, a.Faults)); err != nil {
		// Fire and forget: the charge goes on, its effects are lost.
		level := slog.LevelWarn
		if a.Faults.Has(lab.FaultAppliedResponseLost) {
			level = slog.LevelInfo // the answer the attempt asked the provider to withhold: the lesson, not an incident
		}
		s.log.Log(ctx, level, "direct send to the provider failed; the charge goes on without it", "charge_id", entry.ChargeID, "err", err)
	}
	if a.Faults.Has(lab.FaultOutboxFail) {
		return lab.Outcome{}, fmt.Errorf("error applying charge %s after its direct send: %w", entry.ChargeID, lab.ErrOutboxWrite)
	}
	c, err := s.books.Apply(ctx, lab.Apply{Entry: entry})
	var oc *lab.OrderConflictError
	if errors.As(err, &oc) {
		return lab.Outcome{Response: lab.OrderConflictResponse(oc)}, nil
	}
	if err != nil {
		return lab.Outcome{}, fmt.Errorf("error applying charge: %w", err)
	}
	lab.Mark(ctx, lab.PhaseCharge)
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		return lab.Outcome{}, lab.ErrCrash
	}
	return lab.Outcome{Response: lab.ChargeResponse(c)}, nil
}
