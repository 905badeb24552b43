package app

import (
	"context"
	"time"

	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/prune"
)

// booksPruner is what the books prune: delivered outbox events and the
// webhook event ids the lab processed.
type booksPruner interface {
	PruneDelivered(ctx context.Context, before time.Time, limit int) (int, error)
	PruneWebhookEvents(ctx context.Context, before time.Time, limit int) (int, error)
}

// pruneTargets are what this lab prunes: its books (on the background's
// pool when PostgreSQL is configured) and its own provider's records. An
// external provider prunes its own (lab provider does).
func (a *App) pruneTargets() []prune.Target {
	var ts []prune.Target
	if b, ok := a.relayOutbox.(booksPruner); ok {
		ts = append(ts, prune.Target{Name: "outbox events", Prune: b.PruneDelivered}, prune.Target{Name: "webhook events", Prune: b.PruneWebhookEvents})
	}
	if p := a.ownProvider; p != nil {
		ts = append(ts, provider.PruneTargets(p)...)
	}
	return ts
}

// runPruner deletes what has outlived the retention every PruneInterval,
// until ctx ends. The ledger and the captures are never among it.
func (a *App) runPruner(ctx context.Context) {
	cutoff := func() time.Time { return a.cfg.Clock().Add(-a.cfg.PruneAfter) }
	prune.Run(ctx, a.cfg.PruneInterval, cutoff, a.pruneTargets(), a.cfg.Logger)
}
