package app

import (
	"context"
	"log/slog"
	"time"
)

// pruneBatch bounds each pruning statement, as the key sweeper's batches
// do: no statement holds its locks long, or grows the WAL in one burst.
const pruneBatch = 1000

// pruneTarget is one kind of row the pruner deletes. Its prune deletes at
// most limit rows older than before, oldest first, rolling up in the same
// step what they still count for, and returns how many it deleted.
type pruneTarget struct {
	name  string
	prune func(ctx context.Context, before time.Time, limit int) (int, error)
}

// booksPruner is what the books prune: delivered outbox events and the
// webhook event ids the lab processed.
type booksPruner interface {
	PruneDelivered(ctx context.Context, before time.Time, limit int) (int, error)
	PruneWebhookEvents(ctx context.Context, before time.Time, limit int) (int, error)
}

// pruneTargets are what this lab prunes: its books (on the background's
// pool when PostgreSQL is configured) and its own provider's records. An
// external provider prunes its own.
func (a *App) pruneTargets() []pruneTarget {
	var ts []pruneTarget
	if b, ok := a.relayOutbox.(booksPruner); ok {
		ts = append(ts, pruneTarget{"outbox events", b.PruneDelivered}, pruneTarget{"webhook events", b.PruneWebhookEvents})
	}
	if p := a.providerPruner; p != nil {
		ts = append(ts, pruneTarget{"provider receipts", p.PruneReceipts}, pruneTarget{"provider webhooks", p.PruneWebhooks})
	}
	return ts
}

// prune deletes what has outlived the retention every PruneInterval, until
// ctx ends. The ledger and the captures are never among it.
func (a *App) prune(ctx context.Context) {
	cutoff := func() time.Time { return a.cfg.Clock().Add(-a.cfg.PruneAfter) }
	runPruner(ctx, a.cfg.PruneInterval, cutoff, a.pruneTargets(), a.cfg.Logger)
}

// runPruner prunes each target of what is older than cutoff, every
// interval, until ctx ends.
func runPruner(ctx context.Context, interval time.Duration, cutoff func() time.Time, targets []pruneTarget, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		before := cutoff()
		for _, tg := range targets {
			n, err := pruneAll(ctx, tg.prune, before, pruneBatch)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				log.Warn("prune failed", "what", tg.name, "pruned", n, "err", err)
			case n > 0:
				log.Info("pruned", "what", tg.name, "pruned", n, "older_than", before)
			}
		}
	}
}

// pruneAll calls prune, one batch of limit at a time, until a batch comes
// back short (nothing older is left) or ctx ends, and returns how many it
// deleted.
func pruneAll(ctx context.Context, prune func(context.Context, time.Time, int) (int, error), before time.Time, limit int) (int, error) {
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := prune(ctx, before, limit)
		total += n
		if err != nil || n < limit {
			return total, err
		}
	}
}
