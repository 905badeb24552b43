package pgdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab/provider"
)

// ProviderRecords keeps the simulated provider's records in PostgreSQL
// (provider.sql), apart from the lab's books: what the provider holds is
// the ground truth the books are checked against.
type ProviderRecords struct{ pool *pgxpool.Pool }

var _ provider.Records = (*ProviderRecords)(nil)

// NewProviderRecords returns the records kept in pool's schema.
func NewProviderRecords(pool *pgxpool.Pool) *ProviderRecords { return &ProviderRecords{pool: pool} }

const captureColumns = `capture_id, idempotency_key, charge_id, tenant_id, run_id, amount_cents, currency, via, status,
	requests, fingerprint, created_at`

func scanCapture(row pgx.CollectableRow) (provider.Capture, error) {
	var c provider.Capture
	err := row.Scan(&c.ID, &c.Key, &c.ChargeID, &c.Tenant, &c.Run, &c.AmountCents, &c.Currency, &c.Via, &c.Status,
		&c.Requests, &c.Fingerprint, &c.CreatedAt)
	c.CreatedAt = c.CreatedAt.UTC()
	return c, err
}

// micro is t as PostgreSQL keeps it; Go truncates where PostgreSQL would
// round, so both stores agree on the time.
func micro(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// Capture applies c once per (tenant, key) in one statement. The primary
// key decides between concurrent twins: one inserts, the others wait for
// its commit and take the update branch. The update counts a replay only
// when the fingerprints agree; otherwise no row comes back, which is how a
// reused key shows.
func (r *ProviderRecords) Capture(ctx context.Context, c provider.Capture) (provider.Capture, bool, error) {
	rows, err := r.pool.Query(ctx, `
		INSERT INTO provider_captures AS pc (capture_id, idempotency_key, charge_id, tenant_id, run_id, amount_cents,
			currency, via, status, fingerprint, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
		ON CONFLICT (tenant_id, idempotency_key) DO UPDATE SET requests = pc.requests + 1
		WHERE pc.fingerprint = EXCLUDED.fingerprint
		RETURNING `+captureColumns,
		c.ID, c.Key, c.ChargeID, c.Tenant, c.Run, c.AmountCents, c.Currency, c.Via, c.Status, c.Fingerprint, micro(c.CreatedAt))
	if err != nil {
		return provider.Capture{}, false, fmt.Errorf("error recording capture %s: %w", c.ID, err)
	}
	stored, err := pgx.CollectExactlyOneRow(rows, scanCapture)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return provider.Capture{}, false, provider.ErrKeyMismatch
	case err != nil:
		return provider.Capture{}, false, fmt.Errorf("error recording capture %s: %w", c.ID, err)
	}
	return stored, stored.ID != c.ID, nil
}

// Receipt records a receipt once per event id.
func (r *ProviderRecords) Receipt(ctx context.Context, rc provider.Receipt) (bool, error) {
	var deliveries int
	err := r.pool.QueryRow(ctx, `
		INSERT INTO provider_receipt_events AS re (event_id, charge_id, tenant_id, run_id, via, first_received_at, last_received_at)
		VALUES ($1, $2, $3, $4, $5, $6, $6)
		ON CONFLICT (event_id) DO UPDATE SET deliveries = re.deliveries + 1, last_received_at = EXCLUDED.last_received_at
		RETURNING deliveries`, rc.EventID, rc.ChargeID, rc.Tenant, rc.Run, rc.Via, micro(rc.ReceivedAt)).Scan(&deliveries)
	if err != nil {
		return false, fmt.Errorf("error recording receipt %s: %w", rc.EventID, err)
	}
	return deliveries > 1, nil
}

// filterWhere selects rows by namespace ($1), run ($2) and charge ($3).
const filterWhere = `($1 = '' OR namespace = $1) AND ($2 = '' OR run_id = $2) AND ($3 = '' OR charge_id = $3)`

// Captures lists the captures f selects, newest first.
func (r *ProviderRecords) Captures(ctx context.Context, f provider.Filter) ([]provider.Capture, error) {
	rows, err := r.pool.Query(ctx, `SELECT `+captureColumns+` FROM provider_captures WHERE `+filterWhere+`
		ORDER BY created_at DESC, seq DESC LIMIT $4`, f.Namespace, f.Run, f.ChargeID, f.EffectiveLimit())
	if err != nil {
		return nil, fmt.Errorf("error listing captures: %w", err)
	}
	list, err := pgx.CollectRows(rows, scanCapture)
	if err != nil {
		return nil, fmt.Errorf("error listing captures: %w", err)
	}
	return list, nil
}

// Stats sums what f selects in one statement.
func (r *ProviderRecords) Stats(ctx context.Context, f provider.Filter) (provider.Stats, error) {
	var s provider.Stats
	err := r.pool.QueryRow(ctx, `
		WITH c AS (SELECT charge_id, requests, amount_cents, status, via FROM provider_captures WHERE `+filterWhere+`),
		     re AS (SELECT deliveries FROM provider_receipt_events WHERE `+filterWhere+`)
		SELECT (SELECT count(*) FROM c),
		       (SELECT coalesce(sum(requests), 0) FROM c)::bigint,
		       (SELECT count(*) FROM (SELECT 1 FROM c GROUP BY charge_id HAVING count(*) > 1) twice),
		       (SELECT coalesce(sum(amount_cents) FILTER (WHERE status = 'succeeded'), 0) FROM c)::bigint,
		       (SELECT count(*) FROM re),
		       (SELECT coalesce(sum(deliveries), 0) FROM re)::bigint,
		       (SELECT count(*) FROM c WHERE via = 'direct')`, f.Namespace, f.Run, f.ChargeID).
		Scan(&s.CapturesApplied, &s.CaptureRequests, &s.ChargesCapturedTwice, &s.CapturedCents,
			&s.Receipts, &s.ReceiptDeliveries, &s.DirectCaptures)
	if err != nil {
		return s, fmt.Errorf("error summing the provider's records: %w", err)
	}
	return s, nil
}

// Reset deletes a namespace's captures and receipts ("" empties both
// tables), and nothing of the lab's own.
func (r *ProviderRecords) Reset(ctx context.Context, ns string) error {
	if ns == "" {
		if _, err := r.pool.Exec(ctx, `TRUNCATE provider_captures, provider_receipt_events`); err != nil {
			return fmt.Errorf("error emptying the provider's records: %w", err)
		}
		return nil
	}
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		for _, q := range []string{
			`DELETE FROM provider_captures WHERE namespace = $1`,
			`DELETE FROM provider_receipt_events WHERE namespace = $1`,
		} {
			if _, err := tx.Exec(ctx, q, ns); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("error deleting the provider's records of namespace %s: %w", ns, err)
	}
	return nil
}
