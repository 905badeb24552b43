package pgdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
)

// Books keeps the ledger, the outbox and the payment states in PostgreSQL,
// shared by every replica and every store.
type Books struct {
	pool *pgxpool.Pool
	now  lab.Clock // outbox schedules and ages use the lab's clock, not the server's
}

// NewBooks returns books on pool (whose search_path is the lab's schema).
func NewBooks(pool *pgxpool.Pool, now lab.Clock) *Books { return &Books{pool: pool, now: now} }

// Kind names the backend.
func (b *Books) Kind() string { return "postgres" }

// Apply records the charge and its event in one transaction, or nothing.
func (b *Books) Apply(ctx context.Context, a lab.Apply) (lab.Charge, error) {
	var c lab.Charge
	// READ COMMITTED whatever the server's default: a waiting INSERT … ON
	// CONFLICT must see the row its twin committed.
	err := pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var err error
		c, err = ApplyTx(ctx, tx, a)
		return err
	})
	return c, err
}

// Querier runs statements inside a transaction: a pgx.Tx, or a connection
// on which the caller began one itself (to send BEGIN with its first
// statements in one round trip).
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ApplyTx inserts the ledger entry, and the outbox event when given, in tx:
// a store that decides in PostgreSQL charges inside its own transaction.
func ApplyTx(ctx context.Context, tx Querier, a lab.Apply) (lab.Charge, error) {
	e := a.Entry
	var fence *int64
	if e.FenceToken != 0 {
		fence = &e.FenceToken
	}
	var order *string
	if e.OrderID != "" {
		order = &e.OrderID
	}
	// ON CONFLICT keeps the transaction usable: the same charge id is the
	// same charge (a retry of a commit whose answer was lost), and a
	// duplicate order becomes a stored business outcome, not an abort.
	tag, err := tx.Exec(ctx, `
		INSERT INTO charges (id, tenant_id, account, amount_cents, currency, order_id, idempotency_key, store, run_id, replica, created_at, fence_token)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
		ON CONFLICT DO NOTHING`,
		e.ChargeID, e.Tenant, e.Account, e.AmountCents, e.Currency, order, e.Key, e.Store, e.Run, e.Replica, e.CreatedAt, fence)
	if err != nil {
		return lab.Charge{}, fmt.Errorf("error inserting charge: %w", err)
	}
	if tag.RowsAffected() == 0 {
		if c, ok, err := chargeByID(ctx, tx, e.ChargeID); err != nil || ok {
			return c, err
		}
		var existing string
		if err := tx.QueryRow(ctx, `SELECT id FROM charges WHERE tenant_id = $1 AND order_id = $2`, e.Tenant, e.OrderID).Scan(&existing); err != nil {
			return lab.Charge{}, fmt.Errorf("error reading the charge of order %q: %w", e.OrderID, err)
		}
		return lab.Charge{}, &lab.OrderConflictError{OrderID: e.OrderID, ChargeID: existing}
	}
	if ev := a.Event; ev != nil {
		if a.FailOutbox {
			return lab.Charge{}, lab.ErrOutboxWrite
		}
		if err := InsertEvent(ctx, tx, ev); err != nil {
			return lab.Charge{}, err
		}
	}
	// The balance last, in one statement that also records it on the
	// charge: its row lock, on which one account's charges queue, is held
	// only from here to the commit.
	var balance int64
	if err := tx.QueryRow(ctx, `
		WITH b AS (
			INSERT INTO account_balances AS ab (tenant_id, account, balance_cents) VALUES ($1, $2, $3)
			ON CONFLICT (tenant_id, account) DO UPDATE SET balance_cents = ab.balance_cents + EXCLUDED.balance_cents
			RETURNING balance_cents)
		UPDATE charges SET balance_after_cents = b.balance_cents FROM b WHERE charges.id = $4
		RETURNING b.balance_cents`, e.Tenant, e.Account, e.AmountCents, e.ChargeID).Scan(&balance); err != nil {
		return lab.Charge{}, fmt.Errorf("error updating balance: %w", err)
	}
	return lab.Charge{
		ID: e.ChargeID, Account: e.Account, AmountCents: e.AmountCents, Currency: e.Currency,
		OrderID: e.OrderID, BalanceCents: balance, CreatedAt: e.CreatedAt,
	}, nil
}

// InsertEvent writes an outbox event in tx.
func InsertEvent(ctx context.Context, tx Querier, ev *lab.Event) error {
	if _, err := tx.Exec(ctx, `
		INSERT INTO outbox (event_id, event_type, charge_id, tenant_id, run_id, payload, next_attempt_at, created_at)
		VALUES ($1::uuid, $2, $3, $4, $5, $6::jsonb, $7, $7)`,
		ev.ID, ev.Type, ev.ChargeID, ev.Tenant, ev.Run, string(ev.Payload), ev.CreatedAt); err != nil {
		return fmt.Errorf("error inserting outbox event: %w", err)
	}
	return nil
}

// chargeByID reads one applied charge.
func chargeByID(ctx context.Context, tx Querier, id string) (lab.Charge, bool, error) {
	var c lab.Charge
	var order *string
	err := tx.QueryRow(ctx, `SELECT id, account, amount_cents, currency, order_id, balance_after_cents, created_at FROM charges WHERE id = $1`, id).
		Scan(&c.ID, &c.Account, &c.AmountCents, &c.Currency, &order, &c.BalanceCents, &c.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("error reading charge %s: %w", id, err)
	}
	if order != nil {
		c.OrderID = *order
	}
	c.CreatedAt = c.CreatedAt.UTC()
	return c, true, nil
}

// OpenRun records that run belongs to namespace ns; opening it again for
// the same namespace is a no-op, for another one ErrRunNotFound's kin: the
// id is taken.
func (b *Books) OpenRun(ctx context.Context, ns lab.Namespace, run string) error {
	var owner string
	err := b.pool.QueryRow(ctx, `
		WITH ins AS (INSERT INTO lab_runs (run_id, namespace, opened_at) VALUES ($1, $2, $3)
		             ON CONFLICT (run_id) DO NOTHING RETURNING namespace)
		SELECT namespace FROM ins UNION ALL SELECT namespace FROM lab_runs WHERE run_id = $1 LIMIT 1`,
		run, string(ns), b.now()).Scan(&owner)
	if err != nil {
		return fmt.Errorf("error opening run %s: %w", run, err)
	}
	if owner != string(ns) {
		return fmt.Errorf("run %s is another namespace's", run)
	}
	return nil
}

// RunNamespace is the namespace run was opened in, or lab.ErrRunNotFound.
func (b *Books) RunNamespace(ctx context.Context, run string) (lab.Namespace, error) {
	var ns string
	err := b.pool.QueryRow(ctx, `SELECT namespace FROM lab_runs WHERE run_id = $1`, run).Scan(&ns)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("run %q: %w", run, lab.ErrRunNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("error reading run %s: %w", run, err)
	}
	return lab.Namespace(ns), nil
}

// RunStats counts what one run created in namespace ns: rows of another
// namespace tagged with the run never count. Delivered events the pruner
// deleted count from its roll-up.
func (b *Books) RunStats(ctx context.Context, ns lab.Namespace, run string) (lab.RunStats, error) {
	var s lab.RunStats
	err := b.pool.QueryRow(ctx, `
		WITH pruned AS (SELECT coalesce(sum(delivered), 0)::bigint AS delivered FROM outbox_rollup WHERE namespace = $2 AND run_id = $1)
		SELECT (SELECT count(*) FROM charges WHERE run_id = $1 AND namespace = $2),
		       (SELECT coalesce(sum(amount_cents), 0)::bigint FROM charges WHERE run_id = $1 AND namespace = $2),
		       (SELECT count(*) FROM outbox WHERE run_id = $1 AND namespace = $2) + pruned.delivered,
		       (SELECT count(*) FROM outbox WHERE run_id = $1 AND namespace = $2 AND state = 'delivered') + pruned.delivered,
		       (SELECT count(*) FROM outbox WHERE run_id = $1 AND namespace = $2 AND state = 'dead'),
		       (SELECT count(*) FROM fenced_writes WHERE run_id = $1 AND namespace = $2)
		FROM pruned`, run, string(ns)).
		Scan(&s.Charges, &s.ChargedCents, &s.OutboxEvents, &s.Delivered, &s.Dead, &s.FencedWrites)
	if err != nil {
		return s, fmt.Errorf("error reading run stats: %w", err)
	}
	return s, nil
}

// Summary aggregates a namespace's ledger per store ("" for every namespace).
func (b *Books) Summary(ctx context.Context, ns lab.Namespace) ([]lab.StoreSummary, error) {
	rows, err := b.pool.Query(ctx, `
		WITH mine AS (SELECT * FROM charges WHERE $1 = '' OR namespace = $1),
		ops AS (
			-- one operation per (tenant, key, order); a charge without a key is its own operation
			SELECT DISTINCT ON (store, tenant_id, CASE WHEN idempotency_key = '' THEN id ELSE idempotency_key END, coalesce(order_id, ''))
			       store, amount_cents
			FROM mine
			ORDER BY store, tenant_id, CASE WHEN idempotency_key = '' THEN id ELSE idempotency_key END, coalesce(order_id, ''), created_at
		)
		SELECT c.store, count(*), sum(c.amount_cents)::bigint,
		       (SELECT count(*) FROM ops WHERE ops.store = c.store),
		       (SELECT sum(amount_cents)::bigint FROM ops WHERE ops.store = c.store)
		FROM mine c GROUP BY c.store ORDER BY c.store`, string(ns))
	if err != nil {
		return nil, fmt.Errorf("error summarising the ledger: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (lab.StoreSummary, error) {
		var s lab.StoreSummary
		var once int64
		err := row.Scan(&s.Store, &s.ChargesApplied, &s.AmountCents, &s.Operations, &once)
		s.DuplicatesApplied = s.ChargesApplied - s.Operations
		s.OverchargedCents = s.AmountCents - once
		return s, err
	})
}

// Balance sums an account's charges in the ledger itself, not the balances
// table: the lab's figures come from the ground truth. The sum is read
// from an index that holds the amounts, not a heap page per charge.
func (b *Books) Balance(ctx context.Context, tenant, account string) (int64, error) {
	var n int64
	err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(amount_cents), 0)::bigint FROM charges WHERE tenant_id = $1 AND account = $2`, tenant, account).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("error reading the balance: %w", err)
	}
	return n, nil
}

// KeyCharges tallies the charges one store made under one tenant's key.
func (b *Books) KeyCharges(ctx context.Context, tenant string, store lab.StoreName, key string) (lab.KeyTally, error) {
	var k lab.KeyTally
	err := b.pool.QueryRow(ctx, `
		SELECT count(*), coalesce(sum(amount_cents), 0)::bigint,
		       coalesce((array_agg(amount_cents ORDER BY created_at, id))[1], 0)::bigint,
		       coalesce(array_agg(id ORDER BY created_at, id) FILTER (WHERE id IS NOT NULL), '{}')
		FROM charges WHERE tenant_id = $1 AND store = $2 AND idempotency_key = $3`, tenant, store, key).
		Scan(&k.Charges, &k.Cents, &k.FirstCents, &k.IDs)
	if err != nil {
		return k, fmt.Errorf("error tallying the key's charges: %w", err)
	}
	return k, nil
}

// AccountMoney reads an account's running balance and the sum of its
// ledger rows in one statement, so in one snapshot: charges committing
// meanwhile (other attendees') are either in both or in neither.
func (b *Books) AccountMoney(ctx context.Context, tenant, account string) (lab.AccountMoney, error) {
	var m lab.AccountMoney
	err := b.pool.QueryRow(ctx, `
		SELECT coalesce((SELECT balance_cents FROM account_balances WHERE tenant_id = $1 AND account = $2), 0)::bigint,
		       coalesce(sum(amount_cents), 0)::bigint, count(*)
		FROM charges WHERE tenant_id = $1 AND account = $2`, tenant, account).Scan(&m.BalanceCents, &m.RowsCents, &m.Rows)
	if err != nil {
		return m, fmt.Errorf("error reading the account's money: %w", err)
	}
	return m, nil
}

const eventColumns = `event_id::text, event_type, charge_id, tenant_id, run_id, payload::text, state, attempts,
	next_attempt_at, coalesce(last_error, ''), created_at, coalesce(delivered_at, 'epoch'::timestamptz),
	coalesce(claim_token::text, ''), coalesce(lease_expires_at, 'epoch'::timestamptz), namespace`

func scanEvent(row pgx.CollectableRow) (lab.Event, error) {
	var e lab.Event
	var payload string
	err := row.Scan(&e.ID, &e.Type, &e.ChargeID, &e.Tenant, &e.Run, &payload, &e.State, &e.Attempts,
		&e.NextAttempt, &e.LastError, &e.CreatedAt, &e.DeliveredAt, &e.ClaimToken, &e.LeaseExpires, &e.Namespace)
	e.Payload = []byte(payload)
	if e.DeliveredAt.Unix() == 0 {
		e.DeliveredAt = time.Time{}
	}
	if e.LeaseExpires.Unix() == 0 {
		e.LeaseExpires = time.Time{}
	}
	return e, err
}

// ClaimDue leases due events to one claim in one short statement: each gets
// the claim's random token, a lease and one more attempt. SKIP LOCKED lets
// several workers and replicas share the work without waiting on each other.
// The due ids are read once, into an array (an InitPlan): under IN (…) a
// plan may run the locking subquery more than once and claim more than
// limit.
func (b *Books) ClaimDue(ctx context.Context, limit int, lease time.Duration) ([]lab.Event, error) {
	rows, err := b.pool.Query(ctx, `
		UPDATE outbox SET attempts = attempts + 1, claim_token = $4::uuid,
		       lease_expires_at = $3::timestamptz + make_interval(secs => $2),
		       next_attempt_at = $3::timestamptz + make_interval(secs => $2)
		WHERE event_id = ANY (ARRAY (
			SELECT event_id FROM outbox WHERE state = 'pending' AND next_attempt_at <= $3
			ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED))
		RETURNING `+eventColumns, limit, lease.Seconds(), b.now(), lab.NewClaimToken())
	if err != nil {
		return nil, fmt.Errorf("error claiming events: %w", err)
	}
	events, err := pgx.CollectRows(rows, scanEvent)
	if err != nil {
		return nil, fmt.Errorf("error reading claimed events: %w", err)
	}
	return events, nil
}

// MarkDelivered records a successful delivery, if the claim still holds
// the event; otherwise it changes nothing and returns lab.ErrFenced.
func (b *Books) MarkDelivered(ctx context.Context, id, token string) error {
	tag, err := b.pool.Exec(ctx, `
		UPDATE outbox SET state = 'delivered', delivered_at = $3, last_error = NULL, claim_token = NULL, lease_expires_at = NULL
		WHERE event_id = $1::uuid AND claim_token = $2::uuid AND state = 'pending'`, id, nullUUID(token), b.now())
	if err != nil {
		return fmt.Errorf("error marking event %s delivered: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("event %s: %w", id, lab.ErrFenced)
	}
	return nil
}

// MarkFailed schedules another try, or gives up, if the claim still holds
// the event; otherwise it changes nothing and returns lab.ErrFenced.
func (b *Books) MarkFailed(ctx context.Context, id, token string, next time.Time, dead bool, reason string) error {
	tag, err := b.pool.Exec(ctx, `
		UPDATE outbox SET next_attempt_at = $3, last_error = $4, state = CASE WHEN $5 THEN 'dead' ELSE state END,
		       claim_token = NULL, lease_expires_at = NULL
		WHERE event_id = $1::uuid AND claim_token = $2::uuid AND state = 'pending'`, id, nullUUID(token), next, reason, dead)
	if err != nil {
		return fmt.Errorf("error recording the failed delivery of %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("event %s: %w", id, lab.ErrFenced)
	}
	return nil
}

// Requeue puts a namespace's dead or failed event back to pending, due now
// with its attempts reset ("" for every namespace). A worker that still
// holds an old claim on it is fenced out.
func (b *Books) Requeue(ctx context.Context, ns lab.Namespace, id string) (lab.Event, error) {
	if uuid.Validate(id) != nil {
		return lab.Event{}, fmt.Errorf("event %s: %w", id, lab.ErrEventNotFound)
	}
	now := b.now()
	rows, err := b.pool.Query(ctx, `
		UPDATE outbox SET state = 'pending', attempts = 0, next_attempt_at = $3, claim_token = NULL, lease_expires_at = NULL
		WHERE event_id = $1::uuid AND ($2 = '' OR namespace = $2)
		  AND (state = 'dead' OR (state = 'pending' AND (lease_expires_at IS NULL OR lease_expires_at <= $3)))
		RETURNING `+eventColumns, id, string(ns), now)
	if err != nil {
		return lab.Event{}, fmt.Errorf("error re-queueing event %s: %w", id, err)
	}
	ev, err := pgx.CollectExactlyOneRow(rows, scanEvent)
	if err == nil {
		return ev, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return lab.Event{}, fmt.Errorf("error re-queueing event %s: %w", id, err)
	}
	// Nothing changed: say why.
	var state string
	err = b.pool.QueryRow(ctx, `SELECT state FROM outbox WHERE event_id = $1::uuid AND ($2 = '' OR namespace = $2)`, id, string(ns)).Scan(&state)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return lab.Event{}, fmt.Errorf("event %s: %w", id, lab.ErrEventNotFound)
	case err != nil:
		return lab.Event{}, fmt.Errorf("error reading event %s: %w", id, err)
	case state == lab.EventDelivered:
		return lab.Event{}, fmt.Errorf("event %s: %w", id, lab.ErrEventDelivered)
	}
	return lab.Event{}, fmt.Errorf("event %s: %w", id, lab.ErrEventInFlight)
}

// nullUUID passes an empty token as NULL, which no row's token equals.
func nullUUID(token string) *string {
	if uuid.Validate(token) != nil {
		return nil
	}
	return &token
}

// Events lists a namespace's newest events ("" for every namespace).
func (b *Books) Events(ctx context.Context, ns lab.Namespace, limit int) ([]lab.Event, error) {
	rows, err := b.pool.Query(ctx, `SELECT `+eventColumns+` FROM outbox WHERE $2 = '' OR namespace = $2 ORDER BY created_at DESC LIMIT $1`, limit, string(ns))
	if err != nil {
		return nil, fmt.Errorf("error listing events: %w", err)
	}
	return pgx.CollectRows(rows, scanEvent)
}

// OutboxBacklog reads a namespace's pending events and the oldest one's
// age ("" for every namespace) from the due index alone: its cost follows
// the backlog, where OutboxStats also counts every delivered event kept.
// It is what a poll of a drain needs.
func (b *Books) OutboxBacklog(ctx context.Context, ns lab.Namespace) (lab.OutboxBacklog, error) {
	var bl lab.OutboxBacklog
	var oldest float64
	err := b.pool.QueryRow(ctx, `
		SELECT count(*), coalesce(extract(epoch FROM $1::timestamptz - min(created_at)), 0)::float8
		FROM outbox WHERE state = 'pending' AND `+InNamespace(ns, 2), b.now(), string(ns)).Scan(&bl.Pending, &oldest)
	if err != nil {
		return bl, fmt.Errorf("error reading the outbox's backlog: %w", err)
	}
	bl.OldestPendingAge = time.Duration(oldest * float64(time.Second))
	return bl, nil
}

// OutboxStats counts a namespace's events by state ("" for every
// namespace). Its cost follows what the outbox holds now, not what it ever
// held: the events not yet delivered come from a partial index, the
// delivered ones from an index alone, and those the pruner deleted from
// its roll-up.
func (b *Books) OutboxStats(ctx context.Context, ns lab.Namespace) (lab.OutboxStats, error) {
	var s lab.OutboxStats
	var oldest float64
	err := b.pool.QueryRow(ctx, `
		WITH open AS (
			SELECT count(*) FILTER (WHERE state = 'pending') AS pending, count(*) FILTER (WHERE state = 'dead') AS dead,
			       count(*) FILTER (WHERE state = 'pending' AND lease_expires_at > $1) AS in_flight,
			       coalesce(sum(greatest(attempts - 1, 0)), 0)::bigint AS retries,
			       coalesce(extract(epoch FROM $1::timestamptz - min(created_at) FILTER (WHERE state = 'pending')), 0)::float8 AS oldest
			FROM outbox WHERE state <> 'delivered' AND `+InNamespace(ns, 2)+`),
		delivered AS (
			SELECT count(*) AS n, coalesce(sum(greatest(attempts - 1, 0)), 0)::bigint AS retries
			FROM outbox WHERE state = 'delivered' AND `+InNamespace(ns, 2)+`),
		pruned AS (
			SELECT coalesce(sum(delivered), 0)::bigint AS n, coalesce(sum(retries), 0)::bigint AS retries
			FROM outbox_rollup WHERE `+InNamespace(ns, 2)+`)
		SELECT open.pending, delivered.n + pruned.n, open.dead, open.in_flight,
		       open.retries + delivered.retries + pruned.retries, open.oldest
		FROM open, delivered, pruned`, b.now(), string(ns)).Scan(&s.Pending, &s.Delivered, &s.Dead, &s.InFlight, &s.Retries, &oldest)
	if err != nil {
		return s, fmt.Errorf("error counting outbox events: %w", err)
	}
	s.OldestPendingAge = time.Duration(oldest * float64(time.Second))
	return s, nil
}

// Reset deletes a namespace's rows from the lab's own tables ("" empties
// them, for the admin), and nothing else.
func (b *Books) Reset(ctx context.Context, ns lab.Namespace) error {
	if ns == "" {
		if _, err := b.pool.Exec(ctx, `TRUNCATE charges, outbox, outbox_rollup, webhook_events, fenced_writes, lease_requests, phase_requests, cached_requests, idempotency_requests, account_balances, lab_runs, charge_captures`); err != nil {
			return fmt.Errorf("error truncating the lab's tables: %w", err)
		}
		return nil
	}
	err := deleteNamespace(ctx, b.pool, string(ns),
		`DELETE FROM webhook_events WHERE namespace = $1`,
		`DELETE FROM charge_captures WHERE namespace = $1`,
		`DELETE FROM fenced_writes WHERE namespace = $1`,
		`DELETE FROM outbox WHERE namespace = $1`,
		// After the events: a prune of them that committed meanwhile has rolled them up by now.
		`DELETE FROM outbox_rollup WHERE namespace = $1`,
		`DELETE FROM charges WHERE namespace = $1`,
		`DELETE FROM idempotency_requests WHERE namespace = $1`,
		`DELETE FROM cached_requests WHERE namespace = $1`,
		`DELETE FROM lease_requests WHERE namespace = $1`,
		`DELETE FROM phase_requests WHERE namespace = $1`,
		`DELETE FROM account_balances WHERE split_part(tenant_id, '~', 1) = $1`,
		`DELETE FROM lab_runs WHERE namespace = $1`,
	)
	if err != nil {
		return fmt.Errorf("error deleting namespace %s: %w", ns, err)
	}
	return nil
}

// deleteNamespace runs the deletes of a namespace's rows in one
// transaction. A webhook or a relay completion of the namespace may lock
// its rows in another order; PostgreSQL then ends one of the two (deadlock
// detected), and the deletes, run again, find the other committed.
func deleteNamespace(ctx context.Context, pool *pgxpool.Pool, ns string, deletes ...string) error {
	return retryDeadlock(ctx, func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, q := range deletes {
				if _, err := tx.Exec(ctx, q, ns); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// retryDeadlock runs fn again, up to three times, while PostgreSQL ends it
// as a deadlock's victim.
func retryDeadlock(ctx context.Context, fn func() error) error {
	err := fn()
	for try := 1; try < 4 && isDeadlock(err); try++ {
		if serr := lab.Sleep(ctx, time.Duration(try)*20*time.Millisecond); serr != nil {
			return errors.Join(err, serr)
		}
		err = fn()
	}
	return err
}

func isDeadlock(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "40P01"
}

// Tenants keeps the tenants who joined the lab, by their token's hash.
type Tenants struct{ pool *pgxpool.Pool }

// NewTenants returns the joined tenants kept in pool's schema.
func NewTenants(pool *pgxpool.Pool) *Tenants { return &Tenants{pool: pool} }

// Add records a joined tenant.
func (t *Tenants) Add(ctx context.Context, tokenHash, tenant string) error {
	if _, err := t.pool.Exec(ctx, `INSERT INTO lab_tenants (token_sha256, tenant_id) VALUES ($1, $2)`, tokenHash, tenant); err != nil {
		return fmt.Errorf("error recording tenant %s: %w", tenant, err)
	}
	return nil
}

// Lookup finds the tenant of a token's hash.
func (t *Tenants) Lookup(ctx context.Context, tokenHash string) (string, bool, error) {
	var tenant string
	err := t.pool.QueryRow(ctx, `SELECT tenant_id FROM lab_tenants WHERE token_sha256 = $1`, tokenHash).Scan(&tenant)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("error looking up a token: %w", err)
	}
	return tenant, true, nil
}

// Count counts the attendees who joined (each has two tenants).
func (t *Tenants) Count(ctx context.Context) (int, error) {
	var n int
	if err := t.pool.QueryRow(ctx, `SELECT count(*) / 2 FROM lab_tenants`).Scan(&n); err != nil {
		return 0, fmt.Errorf("error counting attendees: %w", err)
	}
	return n, nil
}

// StaleToken reports the ledger's refusal of an entry whose fencing token
// is no longer its key's current one.
func StaleToken(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "LF001"
}
