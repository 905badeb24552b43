package pgdb

import (
	"context"
	"fmt"
	"time"
)

// What the pruner deletes, each call one bounded statement (the caller
// loops until a call deletes fewer than its limit): oldest first, and
// FOR UPDATE SKIP LOCKED so that the pruners of several processes never
// wait on each other, nor count a row twice. Rows another transaction
// holds are left for the next pass. The rows are picked into an array
// first, as the key sweeper does: an IN (… LIMIT) subquery may be run
// again by the plan and delete more than its limit.

// PruneDelivered deletes at most limit outbox events delivered before
// before, and adds what they counted for (per namespace and run: the
// events delivered, their attempts beyond the first) to outbox_rollup in
// the same statement, so the counts read the same before and after. Only
// delivered events go: a pending or dead one is still owed. It returns how
// many it deleted.
func (b *Books) PruneDelivered(ctx context.Context, before time.Time, limit int) (int, error) {
	var n int
	// The roll-up rows are written in key order, so two pruners never
	// lock two of them in opposite orders.
	err := b.pool.QueryRow(ctx, `
		WITH gone AS (
			DELETE FROM outbox WHERE state = 'delivered' AND event_id = ANY (ARRAY(
				SELECT event_id FROM outbox WHERE state = 'delivered' AND delivered_at < $1
				ORDER BY delivered_at LIMIT $2 FOR UPDATE SKIP LOCKED))
			RETURNING namespace, run_id, attempts),
		sums AS (
			SELECT namespace, run_id, count(*) AS delivered, sum(greatest(attempts - 1, 0)) AS retries
			FROM gone GROUP BY namespace, run_id),
		rolled AS (
			INSERT INTO outbox_rollup AS r (namespace, run_id, delivered, retries)
			SELECT namespace, run_id, delivered, retries FROM sums ORDER BY namespace, run_id
			ON CONFLICT (namespace, run_id) DO UPDATE SET delivered = r.delivered + EXCLUDED.delivered, retries = r.retries + EXCLUDED.retries)
		SELECT coalesce(sum(delivered), 0)::int FROM sums`, before, limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("error pruning delivered events: %w", err)
	}
	return n, nil
}

// PruneWebhookEvents deletes at most limit of the provider event ids the
// lab processed before before, and returns how many. Their only use is to
// make a redelivery a duplicate, and the retention outlasts the provider's
// redelivery window (the app checks it). A webhook that did not match its
// charge is kept: reconcile reports it.
func (b *Books) PruneWebhookEvents(ctx context.Context, before time.Time, limit int) (int, error) {
	tag, err := b.pool.Exec(ctx, `
		DELETE FROM webhook_events WHERE event_id = ANY (ARRAY(
			SELECT event_id FROM webhook_events WHERE mismatch IS NULL AND received_at < $1
			ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED))`, before, limit)
	if err != nil {
		return 0, fmt.Errorf("error pruning webhook events: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
