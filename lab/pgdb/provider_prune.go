package pgdb

import (
	"context"
	"fmt"
	"time"

	"github.com/idempotency-lab/lab/lab/provider"
)

// The provider's records are pruned as the books are (prune.go).

var _ provider.Pruner = (*ProviderRecords)(nil)

// PruneWebhooks deletes at most limit webhooks delivered before before,
// counting them in provider_rollup in the same statement; a pending or
// dead one stays. It returns how many it deleted.
func (r *ProviderRecords) PruneWebhooks(ctx context.Context, before time.Time, limit int) (int, error) {
	var n int
	err := r.pool.QueryRow(ctx, `
		WITH gone AS (
			DELETE FROM provider_webhooks WHERE state = 'delivered' AND ctid = ANY (ARRAY(
				SELECT ctid FROM provider_webhooks WHERE state = 'delivered' AND done_at < $1
				ORDER BY done_at LIMIT $2 FOR UPDATE SKIP LOCKED))
			RETURNING namespace, run_id),
		sums AS (SELECT namespace, run_id, count(*) AS n FROM gone GROUP BY namespace, run_id),
		rolled AS (
			INSERT INTO provider_rollup AS r (namespace, run_id, webhooks_delivered)
			SELECT namespace, run_id, n FROM sums ORDER BY namespace, run_id
			ON CONFLICT (namespace, run_id) DO UPDATE SET webhooks_delivered = r.webhooks_delivered + EXCLUDED.webhooks_delivered)
		SELECT coalesce(sum(n), 0)::int FROM sums`, micro(before), limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("error pruning delivered webhooks: %w", err)
	}
	return n, nil
}

// PruneReceipts deletes at most limit receipts last received before
// before, counting them and their deliveries in provider_rollup in the
// same statement. It returns how many it deleted.
func (r *ProviderRecords) PruneReceipts(ctx context.Context, before time.Time, limit int) (int, error) {
	var n int
	err := r.pool.QueryRow(ctx, `
		WITH gone AS (
			DELETE FROM provider_receipt_events WHERE event_id = ANY (ARRAY(
				SELECT event_id FROM provider_receipt_events WHERE last_received_at < $1
				ORDER BY last_received_at LIMIT $2 FOR UPDATE SKIP LOCKED))
			RETURNING namespace, run_id, deliveries),
		sums AS (SELECT namespace, run_id, count(*) AS n, sum(deliveries) AS d FROM gone GROUP BY namespace, run_id),
		rolled AS (
			INSERT INTO provider_rollup AS r (namespace, run_id, receipts, receipt_deliveries)
			SELECT namespace, run_id, n, d FROM sums ORDER BY namespace, run_id
			ON CONFLICT (namespace, run_id) DO UPDATE SET receipts = r.receipts + EXCLUDED.receipts,
				receipt_deliveries = r.receipt_deliveries + EXCLUDED.receipt_deliveries)
		SELECT coalesce(sum(n), 0)::int FROM sums`, micro(before), limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("error pruning receipts: %w", err)
	}
	return n, nil
}
