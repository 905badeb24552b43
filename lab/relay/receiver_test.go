package relay_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab/delivery"
	"github.com/idempotency-lab/lab/lab/provider"
)

// receiver is the payment provider over real HTTP, keeping its records in
// memory, and the delivery the relay makes to it.
type receiver struct {
	*delivery.Provider
	records  *provider.Memory
	provider *provider.Provider
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	records := provider.NewMemory()
	cfg := provider.DefaultConfig()
	cfg.Records, cfg.Logger = records, slog.New(slog.DiscardHandler)
	p, err := provider.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	p.Register(e.Group("/provider"))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return &receiver{Provider: delivery.New(provider.NewClient(srv.URL+"/provider", srv.Client())), records: records, provider: p}
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
