package relay_test

import (
	"context"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/delivery"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/provider"
)

// receiver is the payment provider over real HTTP, keeping its records in
// memory, and the delivery the relay makes to it, which records each
// capture in the books.
type receiver struct {
	*delivery.Courier
	records  *provider.Memory
	provider *provider.Provider
}

func newReceiver(t *testing.T, books lab.CaptureRecorder) *receiver {
	t.Helper()
	ps := labtest.StartProvider(t)
	return &receiver{Courier: delivery.New(ps.Client, books), records: ps.Records, provider: ps.Provider}
}

// receipts counts a run's distinct receipts and their deliveries at the
// provider.
func (r *receiver) receipts(ctx context.Context, run string) (unique, deliveries int, err error) {
	s, err := r.records.Stats(ctx, provider.Filter{Run: run})
	return s.Receipts, s.ReceiptDeliveries, err
}

// captures counts a run's captures and the requests that carried their keys.
func (r *receiver) captures(ctx context.Context, run string) (applied, requests int, err error) {
	s, err := r.records.Stats(ctx, provider.Filter{Run: run})
	return s.CapturesApplied, s.CaptureRequests, err
}
