package pgdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/provider"
)

// ProviderRecords keeps the simulated provider's records in PostgreSQL
// (provider.sql), apart from the lab's books: what the provider holds is
// the ground truth the books are checked against.
type ProviderRecords struct {
	pool *pgxpool.Pool
	acks *pgxpool.Pool // the webhooks' claims and outcomes
}

var _ provider.Records = (*ProviderRecords)(nil)

// NewProviderRecords returns the records kept in pool's schema.
func NewProviderRecords(pool *pgxpool.Pool) *ProviderRecords {
	return &ProviderRecords{pool: pool, acks: pool}
}

// AckingThrough returns the records with the webhooks' claims and outcomes
// written through acks, a pool of the same schema that may commit
// asynchronously (PoolConfig.AsyncCommit): losing one in a crash sends a
// webhook again, which the lab deduplicates by event id. Captures and
// receipts stay on the records' own pool.
func (r *ProviderRecords) AckingThrough(acks *pgxpool.Pool) *ProviderRecords {
	return &ProviderRecords{pool: r.pool, acks: acks}
}

const captureColumns = `capture_id, idempotency_key, charge_id, tenant_id, run_id, amount_cents, currency, via, status,
	requests, fingerprint, created_at, namespace`

func scanCapture(row pgx.CollectableRow) (provider.Capture, error) {
	var c provider.Capture
	err := row.Scan(&c.ID, &c.Key, &c.ChargeID, &c.Tenant, &c.Run, &c.AmountCents, &c.Currency, &c.Via, &c.Status,
		&c.Requests, &c.Fingerprint, &c.CreatedAt, &c.Namespace)
	c.CreatedAt = c.CreatedAt.UTC()
	return c, err
}

// micro is t as PostgreSQL keeps it; Go truncates where PostgreSQL would
// round, so both stores agree on the time.
func micro(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// Capture applies c once per (tenant, key), and writes hooks with it, in
// one statement. The primary key decides between concurrent twins: one
// inserts, the others wait for its commit and take the update branch. The
// update counts a replay only when the fingerprints agree; otherwise no
// row comes back, which is how a reused key shows. The webhooks are
// inserted only when the capture row that comes back is c itself: when it
// applied. The receipt, when there is one, is recorded by the same
// statement when a capture row comes back.
func (r *ProviderRecords) Capture(ctx context.Context, c provider.Capture, hooks []provider.Webhook, receipt *provider.Receipt) (provider.Captured, error) {
	var (
		seqs                        []int32
		ids, types, bodies          []string
		forged                      []bool
		nextAt, giveUpAt, createdAt []time.Time
	)
	for _, h := range hooks {
		seqs, ids, types, bodies = append(seqs, int32(h.Seq)), append(ids, h.EventID), append(types, h.Type), append(bodies, string(h.Body))
		forged = append(forged, h.Forged)
		nextAt, giveUpAt, createdAt = append(nextAt, micro(h.NextAttempt)), append(giveUpAt, micro(h.GiveUpAt)), append(createdAt, micro(h.CreatedAt))
	}
	var rc provider.Receipt
	if receipt != nil {
		rc = *receipt
	}
	rows, err := r.pool.Query(ctx, `
		WITH c AS (
			INSERT INTO provider_captures AS pc (capture_id, idempotency_key, charge_id, tenant_id, run_id, amount_cents,
				currency, via, status, fingerprint, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
			ON CONFLICT (tenant_id, idempotency_key) DO UPDATE SET requests = pc.requests + 1
			WHERE pc.fingerprint = EXCLUDED.fingerprint
			RETURNING `+captureColumns+`
		), w AS (
			INSERT INTO provider_webhooks (capture_id, seq, event_id, event_type, charge_id, tenant_id, run_id, body, forged,
				next_attempt_at, give_up_at, created_at, held)
			SELECT $1, h.seq, h.event_id, h.event_type, $3, $4, $5, h.body, h.forged, h.next_at, h.give_up_at, h.created_at, h.seq > 0
			FROM unnest($12::int[], $13::text[], $14::text[], $15::text[], $16::bool[], $17::timestamptz[], $18::timestamptz[], $19::timestamptz[])
				AS h(seq, event_id, event_type, body, forged, next_at, give_up_at, created_at)
			WHERE EXISTS (SELECT 1 FROM c WHERE c.capture_id = $1)
		), r AS (
			INSERT INTO provider_receipt_events AS re (event_id, charge_id, tenant_id, run_id, via, first_received_at, last_received_at)
			SELECT $20, $21, $22, $23, $24, $25, $25 WHERE $20 <> '' AND EXISTS (SELECT 1 FROM c)
			ON CONFLICT (event_id) DO UPDATE SET deliveries = re.deliveries + 1, last_received_at = EXCLUDED.last_received_at
			RETURNING deliveries
		)
		SELECT `+captureColumns+`, coalesce((SELECT deliveries FROM r), 0) > 1 FROM c`,
		c.ID, c.Key, c.ChargeID, c.Tenant, c.Run, c.AmountCents, c.Currency, c.Via, c.Status, c.Fingerprint, micro(c.CreatedAt),
		seqs, ids, types, bodies, forged, nextAt, giveUpAt, createdAt,
		rc.EventID, rc.ChargeID, rc.Tenant, rc.Run, rc.Via, micro(rc.ReceivedAt))
	if err != nil {
		return provider.Captured{}, fmt.Errorf("error recording capture %s: %w", c.ID, err)
	}
	got, err := pgx.CollectExactlyOneRow(rows, func(row pgx.CollectableRow) (provider.Captured, error) {
		var g provider.Captured
		s := &g.Capture
		err := row.Scan(&s.ID, &s.Key, &s.ChargeID, &s.Tenant, &s.Run, &s.AmountCents, &s.Currency, &s.Via, &s.Status,
			&s.Requests, &s.Fingerprint, &s.CreatedAt, &s.Namespace, &g.ReceiptDuplicate)
		s.CreatedAt = s.CreatedAt.UTC()
		return g, err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return provider.Captured{}, provider.ErrKeyMismatch
	case err != nil:
		return provider.Captured{}, fmt.Errorf("error recording capture %s: %w", c.ID, err)
	}
	got.Replayed = got.ID != c.ID
	return got, nil
}

// webhookColumns follow a webhook's key (capture_id, seq) in what
// scanWebhook reads.
const webhookColumns = `event_id, event_type, charge_id, tenant_id, run_id, body, forged, state, attempts,
	next_attempt_at, give_up_at, created_at, coalesce(claim_token::text, ''), last_status, last_error`

func scanWebhook(row pgx.CollectableRow) (provider.Webhook, error) {
	var w provider.Webhook
	var body string
	err := row.Scan(&w.CaptureID, &w.Seq, &w.EventID, &w.Type, &w.ChargeID, &w.Tenant, &w.Run, &body, &w.Forged, &w.State, &w.Attempts,
		&w.NextAttempt, &w.GiveUpAt, &w.CreatedAt, &w.ClaimToken, &w.LastStatus, &w.LastError)
	w.Body = []byte(body)
	w.NextAttempt, w.GiveUpAt, w.CreatedAt = w.NextAttempt.UTC(), w.GiveUpAt.UTC(), w.CreatedAt.UTC()
	return w, err
}

// ClaimWebhooks leases due webhooks in one statement: the first pending
// one of each capture whose time has come (the others are held until the
// one before them is done), each stamped with the claim's random token, a
// lease and one more attempt. SKIP LOCKED lets several workers and
// processes share them without waiting on each other. The claim reads
// the ready index alone: it probes no predecessors, which on a table
// churning faster than its statistics PostgreSQL planned as a walk of every
// pending row's index entries, live and dead, per candidate (36 ms a
// claim of 16 once 90,000 dead entries had piled up, and one claim loop
// sends every webhook).
func (r *ProviderRecords) ClaimWebhooks(ctx context.Context, now time.Time, limit int, lease time.Duration) ([]provider.Webhook, error) {
	rows, err := r.acks.Query(ctx, `
		UPDATE provider_webhooks w SET attempts = w.attempts + 1, claim_token = $4::uuid,
		       lease_expires_at = $1::timestamptz + make_interval(secs => $3),
		       next_attempt_at = $1::timestamptz + make_interval(secs => $3)
		FROM (
			SELECT capture_id, seq FROM provider_webhooks p
			WHERE p.state = 'pending' AND NOT p.held AND p.next_attempt_at <= $1
			ORDER BY p.next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED) due
		WHERE w.capture_id = due.capture_id AND w.seq = due.seq
		RETURNING w.capture_id, w.seq, `+webhookColumns, micro(now), limit, lease.Seconds(), uuid.NewString())
	if err != nil {
		return nil, fmt.Errorf("error claiming webhooks: %w", err)
	}
	hooks, err := pgx.CollectRows(rows, scanWebhook)
	if err != nil {
		return nil, fmt.Errorf("error reading claimed webhooks: %w", err)
	}
	return hooks, nil
}

// releaseNext is the tail of a statement whose CTE done completed one
// webhook (delivered, or given up: released): the next of its capture is
// released in the same statement, and the statement counts what done did.
const releaseNext = `, next AS (
			UPDATE provider_webhooks n SET held = false FROM done
			WHERE done.released AND n.capture_id = done.capture_id AND n.seq = done.seq + 1 AND n.held
		)
		SELECT count(*) FROM done`

// WebhookDelivered records w delivered, if its claim still holds it, and
// releases the next webhook of its capture.
func (r *ProviderRecords) WebhookDelivered(ctx context.Context, w provider.Webhook, at time.Time, status int) error {
	var done int
	err := r.acks.QueryRow(ctx, `
		WITH done AS (
			UPDATE provider_webhooks SET state = 'delivered', done_at = $4, last_status = $5, last_error = '',
			       claim_token = NULL, lease_expires_at = NULL
			WHERE capture_id = $1 AND seq = $2 AND claim_token = $3::uuid AND state = 'pending'
			RETURNING capture_id, seq, true AS released
		)`+releaseNext,
		w.CaptureID, w.Seq, nullUUID(w.ClaimToken), micro(at), status).Scan(&done)
	if err != nil {
		return fmt.Errorf("error marking webhook %s delivered: %w", w.EventID, err)
	}
	if done == 0 {
		return fmt.Errorf("webhook %s of capture %s: %w", w.EventID, w.CaptureID, provider.ErrWebhookFenced)
	}
	return nil
}

// WebhookFailed schedules w again at next, or gives it up and releases
// the next webhook of its capture, if its claim still holds it.
func (r *ProviderRecords) WebhookFailed(ctx context.Context, w provider.Webhook, next time.Time, dead bool, status int, reason string) error {
	var done int
	err := r.acks.QueryRow(ctx, `
		WITH done AS (
			UPDATE provider_webhooks SET next_attempt_at = $4::timestamptz, last_status = $5, last_error = $6,
			       state = CASE WHEN $7::boolean THEN 'dead' ELSE state END, done_at = CASE WHEN $7::boolean THEN $4::timestamptz END,
			       claim_token = NULL, lease_expires_at = NULL
			WHERE capture_id = $1 AND seq = $2 AND claim_token = $3::uuid AND state = 'pending'
			RETURNING capture_id, seq, $7::boolean AS released
		)`+releaseNext,
		w.CaptureID, w.Seq, nullUUID(w.ClaimToken), micro(next), status, reason, dead).Scan(&done)
	if err != nil {
		return fmt.Errorf("error recording the failed attempt of webhook %s: %w", w.EventID, err)
	}
	if done == 0 {
		return fmt.Errorf("webhook %s of capture %s: %w", w.EventID, w.CaptureID, provider.ErrWebhookFenced)
	}
	return nil
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
// Each field has two forms, as InNamespace has, so a plan reused for
// every call still walks an index: the newest captures of a namespace are
// read from (namespace, created_at), not sorted out of all of them.
func filterWhere(f provider.Filter) string {
	where := InNamespace(lab.Namespace(f.Namespace), 1)
	if f.Run == "" {
		where += " AND $2 = ''"
	} else {
		where += " AND run_id = $2"
	}
	if f.ChargeID == "" {
		return where + " AND $3 = ''"
	}
	return where + " AND charge_id = $3"
}

// Captures lists the captures f selects, newest first.
func (r *ProviderRecords) Captures(ctx context.Context, f provider.Filter) ([]provider.Capture, error) {
	rows, err := r.pool.Query(ctx, `SELECT `+captureColumns+` FROM provider_captures WHERE `+filterWhere(f)+`
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

// Stats sums what f selects in one statement. The receipts and delivered
// webhooks the pruner deleted count from its roll-up, which knows their
// namespace and run but not their charge: a filter by charge sums the rows
// alone.
func (r *ProviderRecords) Stats(ctx context.Context, f provider.Filter) (provider.Stats, error) {
	var s provider.Stats
	where := filterWhere(f)
	// The roll-up has no charge: its form of the charge's condition, $3 = '',
	// selects none of it when f names a charge.
	rollupWhere := filterWhere(provider.Filter{Namespace: f.Namespace, Run: f.Run})
	err := r.pool.QueryRow(ctx, `
		WITH c AS (SELECT charge_id, requests, amount_cents, status, via FROM provider_captures WHERE `+where+`),
		     re AS (SELECT deliveries FROM provider_receipt_events WHERE `+where+`),
		     w AS (SELECT state FROM provider_webhooks WHERE `+where+`),
		     pruned AS (SELECT coalesce(sum(receipts), 0)::bigint AS receipts, coalesce(sum(receipt_deliveries), 0)::bigint AS deliveries,
		                       coalesce(sum(webhooks_delivered), 0)::bigint AS webhooks
		                FROM provider_rollup WHERE `+rollupWhere+`)
		SELECT (SELECT count(*) FROM c),
		       (SELECT coalesce(sum(requests), 0) FROM c)::bigint,
		       (SELECT count(*) FROM (SELECT 1 FROM c GROUP BY charge_id HAVING count(*) > 1) twice),
		       (SELECT coalesce(sum(amount_cents) FILTER (WHERE status = 'succeeded'), 0) FROM c)::bigint,
		       (SELECT count(*) FROM re) + pruned.receipts,
		       (SELECT coalesce(sum(deliveries), 0) FROM re)::bigint + pruned.deliveries,
		       (SELECT count(*) FROM c WHERE via = 'direct'),
		       (SELECT count(*) FILTER (WHERE state = 'pending') FROM w),
		       (SELECT count(*) FILTER (WHERE state = 'delivered') FROM w) + pruned.webhooks,
		       (SELECT count(*) FILTER (WHERE state = 'dead') FROM w)
		FROM pruned`, f.Namespace, f.Run, f.ChargeID).
		Scan(&s.CapturesApplied, &s.CaptureRequests, &s.ChargesCapturedTwice, &s.CapturedCents,
			&s.Receipts, &s.ReceiptDeliveries, &s.DirectCaptures, &s.WebhooksQueued, &s.WebhooksDelivered, &s.WebhooksDead)
	if err != nil {
		return s, fmt.Errorf("error summing the provider's records: %w", err)
	}
	return s, nil
}

// Queued counts the webhooks still to send, but those last refused with
// 404 or 409 (see provider.Records), through their due index: the pending
// rows alone.
func (r *ProviderRecords) Queued(ctx context.Context) (int, error) {
	var n int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM provider_webhooks WHERE state = 'pending' AND last_status NOT IN (404, 409)`).Scan(&n); err != nil {
		return 0, fmt.Errorf("error counting the provider's queued webhooks: %w", err)
	}
	return n, nil
}

// Reset deletes a namespace's captures, receipts and webhooks ("" empties
// the tables), and nothing of the lab's own.
func (r *ProviderRecords) Reset(ctx context.Context, ns string) error {
	if ns == "" {
		if _, err := r.pool.Exec(ctx, `TRUNCATE provider_captures, provider_receipt_events, provider_webhooks, provider_rollup`); err != nil {
			return fmt.Errorf("error emptying the provider's records: %w", err)
		}
		return nil
	}
	err := deleteNamespace(ctx, r.pool, ns,
		`DELETE FROM provider_captures WHERE namespace = $1`,
		`DELETE FROM provider_receipt_events WHERE namespace = $1`,
		`DELETE FROM provider_webhooks WHERE namespace = $1`,
		// After the rows: a prune of them that committed meanwhile has rolled them up by now.
		`DELETE FROM provider_rollup WHERE namespace = $1`,
	)
	if err != nil {
		return fmt.Errorf("error deleting the provider's records of namespace %s: %w", ns, err)
	}
	return nil
}
