// Package prune deletes, in batches, what has outlived its retention: the
// rows that only settle a delivery (delivered outbox events, processed
// webhook ids, the provider's receipts and delivered webhooks), never the
// ledger or the captures. Each target rolls up what its rows still count
// for in the statement that deletes them.
package prune

import (
	"context"
	"log/slog"
	"time"
)

// Batch bounds each pruning statement, as the key sweeper's batches do:
// no statement holds its locks long, or grows the WAL in one burst.
const Batch = 1000

// Target is one kind of row to prune. Prune deletes at most limit rows
// older than before, oldest first, rolling up in the same step what they
// still count for, and returns how many it deleted.
type Target struct {
	Name  string
	Prune func(ctx context.Context, before time.Time, limit int) (int, error)
}

// Run prunes each target of what is older than cutoff, every interval, in
// batches of Batch, until ctx ends.
func Run(ctx context.Context, interval time.Duration, cutoff func() time.Time, targets []Target, log *slog.Logger) {
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
			n, err := All(ctx, tg.Prune, before, Batch)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				log.Warn("prune failed", "what", tg.Name, "pruned", n, "err", err)
			case n > 0:
				log.Info("pruned", "what", tg.Name, "pruned", n, "older_than", before)
			}
		}
	}
}

// All calls prune, one batch of limit at a time, until a batch comes back
// short (nothing older is left) or ctx ends, and returns how many it
// deleted.
func All(ctx context.Context, prune func(context.Context, time.Time, int) (int, error), before time.Time, limit int) (int, error) {
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
