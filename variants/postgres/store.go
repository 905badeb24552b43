// Package postgres is the design that holds: key, ledger entry, outbox event
// and stored response committed in one PostgreSQL transaction.
package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// Store decides with the database: INSERT … ON CONFLICT on the primary key
// (tenant, endpoint, key) picks one owner, and the owner commits key, charge,
// outbox event and response in one transaction.
type Store struct {
	table   string     // the key table: idempotency_requests, or another design's copy of it
	pool    *pgdb.Pool // every connection taken for a namespace, within its budget
	window  time.Duration
	wait    time.Duration
	appName string // application_name of this lab's connections
	reset   func() // drops every pool's connections after a restart
	now     lab.Clock
}

// Config configures a Store; every field but ResetPools is required.
type Config struct {
	// Table holds the keys: idempotency_requests for this design; a design
	// built on it keeps its keys apart in a table of the same shape.
	Table   string
	Pool    *pgdb.Pool    // its search_path is the lab's schema (pgdb.Open); one budget per namespace, shared with every store on it
	Window  time.Duration // key retention
	Wait    time.Duration // bound on waiting for a connection, then for a twin in flight
	AppName string        // application_name shared by this lab's pools (store_restart kills them)
	// ResetPools drops the connections of every pool sharing AppName after
	// Restart killed their sessions; nil drops this store's pool only.
	ResetPools func()
	Now        lab.Clock // the time keys are created and expire by
}

// New returns the postgres store.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.Pool == nil || cfg.Now == nil:
		return nil, errors.New("postgres: pool and clock are required")
	case cfg.AppName == "":
		return nil, errors.New("postgres: an application_name is required, so a restart finds only this lab's sessions")
	case cfg.Window <= 0 || cfg.Wait <= 0:
		return nil, fmt.Errorf("postgres: window and wait must be positive (got %s, %s)", cfg.Window, cfg.Wait)
	case !keyTable.MatchString(cfg.Table):
		return nil, fmt.Errorf("postgres: key table %q must be a plain lower-case name", cfg.Table)
	}
	reset := cfg.ResetPools
	if reset == nil {
		reset = cfg.Pool.Raw().Reset
	}
	return &Store{table: cfg.Table, pool: cfg.Pool, window: cfg.Window, wait: cfg.Wait, appName: cfg.AppName, reset: reset, now: cfg.Now}, nil
}

// DefaultTable is the postgres design's key table.
const DefaultTable = "idempotency_requests"

var keyTable = regexp.MustCompile(`^[a-z_]{1,63}$`)

// q names the store's key table in a statement written for the default one.
func (s *Store) q(sql string) string {
	if s.table == DefaultTable {
		return sql
	}
	return strings.ReplaceAll(sql, DefaultTable, s.table)
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// Charge runs the attempt in one transaction. A dropped connection before
// the outcome is known is retried: the key makes the retry safe.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	if out, ok, err := s.replayFast(ctx, a); ok || err != nil {
		return out, err
	}
	var (
		out lab.Outcome
		err error
	)
	pipelined := true
	for try := 0; try < 3; try++ {
		out, err = s.charge(ctx, a, pipelined)
		if errors.Is(err, errTakeSlowPath) {
			pipelined = false
			out, err = s.charge(ctx, a, pipelined)
		}
		if err == nil || !pgdb.ConnectionLost(err) || ctx.Err() != nil {
			break
		}
	}
	return out, err
}

// errTakeSlowPath says the pipelined charge rolled back on a case it leaves
// to the step-by-step transaction: the charge id or the order already in
// the ledger, or a deadlock with a twin taking the other path.
var errTakeSlowPath = errors.New("postgres: the pipelined charge rolled back; charging step by step")

// replayFast answers a retry of a completed, unexpired key with the same
// fingerprint from one statement, outside any transaction: the most common
// request of an idempotent API in one round trip. Anything else (absent, in
// flight, expired, another fingerprint, or an error) is left to the
// transaction, which decides it as before. It takes no namespace slot: it
// holds a connection for one statement and never waits on a lock. Only a
// pool that stays exhausted for the bounded wait is an error here.
func (s *Store) replayFast(ctx context.Context, a lab.Attempt) (lab.Outcome, bool, error) {
	acquireCtx, cancel := context.WithTimeout(ctx, s.wait)
	defer cancel()
	conn, err := s.pool.Acquire(acquireCtx, a.Scope.Namespace, pgdb.Short)
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, lab.ErrStoreUnavailable) {
			return lab.Outcome{}, false, fmt.Errorf("%w (waited %s)", err, s.wait)
		}
		return lab.Outcome{}, false, nil // the transaction tries again, and says what failed
	}
	defer conn.Release()
	return s.replayOn(ctx, conn.Conn, a)
}

// replayOn is replayFast's statement on a connection already held.
func (s *Store) replayOn(ctx context.Context, conn *pgxpool.Conn, a lab.Attempt) (lab.Outcome, bool, error) {
	var status int
	var body []byte
	err := conn.QueryRow(ctx, s.q(`
		SELECT response_status, response_body FROM idempotency_requests
		WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3
		  AND state = 'completed' AND request_fingerprint = $4 AND expires_at > $5 AND response_status IS NOT NULL`),
		a.Scope.Tenant, a.Scope.Endpoint, a.Scope.Key, a.Fingerprint, s.now()).Scan(&status, &body)
	if err != nil {
		return lab.Outcome{}, false, nil
	}
	return lab.Outcome{Response: lab.Response{Status: status, Body: body}, Replayed: true}, true, nil
}

// charge claims the key and charges behind it in one transaction. With
// pipelined, a charge without the outbox fault is one statement sent with
// COMMIT (chargeAndCommit); otherwise it goes statement by statement.
func (s *Store) charge(ctx context.Context, a lab.Attempt, pipelined bool) (out lab.Outcome, err error) {
	retention := a.Faults.RetentionOr(s.window)
	// The whole wait is bounded: for the namespace's budget and a
	// connection, then for a twin's lock.
	start := time.Now()
	ns := a.Scope.Namespace
	acquireCtx, cancel := context.WithTimeout(ctx, s.wait)
	defer cancel()
	conn, err := s.pool.Acquire(acquireCtx, ns, pgdb.Short)
	if err != nil {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		return out, fmt.Errorf("%w (waited %s)", err, s.wait)
	}
	defer conn.Release()
	if conn.Waited() {
		// It queued behind the namespace's other attempts, often its own
		// twins: if one completed meanwhile, answer from its row at once.
		if out, ok, err := s.replayOn(ctx, conn.Conn, a); ok || err != nil {
			return out, err
		}
	}
	// Rolls back on every early return, injected crashes included, as the
	// server would on a dead session. (A connection released inside a
	// transaction would be closed by the pool.)
	committed := false
	defer func() {
		if !committed {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	// BEGIN, the lock timeout and the claim go in one round trip. READ
	// COMMITTED whatever the server's default: after waiting for a twin, the
	// claim must see the row the twin committed.
	lockWait := max(s.wait-time.Since(start), time.Millisecond)
	now := s.now()
	claimed, row, err := s.claim(ctx, conn.Conn, a, now, retention, strconv.FormatInt(lockWait.Milliseconds(), 10))
	switch {
	case isLockTimeout(err):
		return out, &lab.InProgressError{RetryAfter: time.Second}
	case err != nil:
		return out, err
	case !claimed:
		return replay(a, row)
	}

	lab.Mark(ctx, lab.PhaseClaim)
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		return out, lab.ErrCrash
	}
	if a.Faults.Pauses() {
		// The transaction stays open through the work: a connection held
		// across slow work, of which a namespace, and the replica, may hold
		// only a few. Without a slot it rolls back, and a retry is safe.
		hold, cancel := context.WithTimeout(ctx, max(s.wait-time.Since(start), time.Millisecond))
		err := conn.HoldAcrossWork(hold)
		cancel()
		if err != nil {
			return out, err
		}
	}
	if err := a.Faults.Pause(ctx); err != nil {
		return out, err
	}
	entry := lab.NewEntry(a, s.now())
	event := lab.NewReceiptEvent(entry, a.Faults)
	if pipelined && !a.Faults.Has(lab.FaultOutboxFail) {
		resp, err := s.chargeAndCommit(ctx, conn.Conn, a, entry, event)
		if err != nil {
			return out, err
		}
		committed = true
		if a.Faults.Has(lab.FaultCrashAfterCharge) {
			return out, lab.ErrCrash // committed; the response is lost on the way
		}
		return lab.Outcome{Response: resp}, nil
	}
	c, err := pgdb.ApplyTx(ctx, conn.Conn, lab.Apply{Entry: entry, Event: event, FailOutbox: a.Faults.Has(lab.FaultOutboxFail)})
	var resp lab.Response
	var oc *lab.OrderConflictError
	switch {
	case errors.As(err, &oc):
		resp = lab.OrderConflictResponse(oc) // a deterministic business outcome: stored and replayed
	case isLockTimeout(err):
		// A hot account row outlasted the bounded wait: the transaction rolls
		// back, nothing is stored, and the client may retry.
		return out, fmt.Errorf("%w: the account's balance stayed locked for %s", lab.ErrStoreUnavailable, s.wait)
	case err != nil:
		return out, err
	default:
		lab.Mark(ctx, lab.PhaseCharge)
		resp = lab.ChargeResponse(c)
	}
	// The response and the commit in one round trip.
	b := &pgx.Batch{}
	b.Queue(s.q(`
		UPDATE idempotency_requests SET state = 'completed', response_status = $4, response_body = $5, resource_id = $6
		WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3`),
		a.Scope.Tenant, a.Scope.Endpoint, a.Scope.Key, resp.Status, resp.Body, c.ID)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	if err != nil {
		_ = br.Close()
		return out, fmt.Errorf("error storing response: %w", err)
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return out, fmt.Errorf("error committing charge: %w", err)
	}
	committed = true
	if tag.String() != "COMMIT" { // COMMIT of an aborted transaction answers ROLLBACK
		return out, fmt.Errorf("error committing charge: the transaction was rolled back (%s)", tag)
	}
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		return out, lab.ErrCrash // committed; the response is lost on the way
	}
	return lab.Outcome{Response: resp}, nil
}

// chargeAndCommit charges behind the claim in one statement, sent with
// COMMIT in one round trip: the balance, the ledger entry (recording the
// balance), the outbox event and the stored response, which the statement
// completes with the balance it wrote. The account's row lock, on which its
// charges queue, is held from that statement to the commit without waiting
// on this process. A charge id or order already in the ledger, or a
// deadlock, rolls it all back (errTakeSlowPath).
func (s *Store) chargeAndCommit(ctx context.Context, conn *pgxpool.Conn, a lab.Attempt, e lab.Entry, ev *lab.Event) (lab.Response, error) {
	c := lab.Charge{ID: e.ChargeID, Account: e.Account, AmountCents: e.AmountCents, Currency: e.Currency, OrderID: e.OrderID, CreatedAt: e.CreatedAt}
	before, after, ok := aroundBalance(c)
	if !ok {
		return lab.Response{}, errTakeSlowPath
	}
	var order *string
	if e.OrderID != "" {
		order = &e.OrderID
	}
	b := &pgx.Batch{}
	b.Queue(s.q(`
		WITH b AS (
			INSERT INTO account_balances AS ab (tenant_id, account, balance_cents) VALUES ($1, $2, $3)
			ON CONFLICT (tenant_id, account) DO UPDATE SET balance_cents = ab.balance_cents + EXCLUDED.balance_cents
			RETURNING balance_cents),
		c AS (
			INSERT INTO charges (id, tenant_id, account, amount_cents, currency, order_id, idempotency_key, store, run_id, replica, created_at, balance_after_cents)
			SELECT $4, $1, $2, $3, $5, $6, $7, $8, $9, $10, $11, b.balance_cents FROM b
			RETURNING id),
		o AS (
			INSERT INTO outbox (event_id, event_type, charge_id, tenant_id, run_id, payload, next_attempt_at, created_at)
			SELECT $12::uuid, $13, c.id, $1, $9, $14::jsonb, $11, $11 FROM c),
		k AS (
			UPDATE idempotency_requests
			SET state = 'completed', response_status = $15, resource_id = $4,
			    response_body = $16::bytea || convert_to(b.balance_cents::text, 'UTF8') || $17::bytea
			FROM b WHERE tenant_id = $1 AND endpoint = $18 AND idempotency_key = $7)
		SELECT balance_cents FROM b`),
		e.Tenant, e.Account, e.AmountCents, e.ChargeID, e.Currency, order, e.Key, e.Store, e.Run, e.Replica, e.CreatedAt,
		ev.ID, ev.Type, string(ev.Payload), http.StatusCreated, before, after, a.Scope.Endpoint)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	err := br.QueryRow().Scan(&c.BalanceCents)
	if err != nil {
		_ = br.Close() // the server skips the COMMIT; the caller's ROLLBACK ends the transaction
		var pe *pgconn.PgError
		switch {
		case errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "40P01"): // unique_violation, deadlock_detected
			return lab.Response{}, errTakeSlowPath
		case isLockTimeout(err):
			return lab.Response{}, fmt.Errorf("%w: the account's balance stayed locked for %s", lab.ErrStoreUnavailable, s.wait)
		}
		return lab.Response{}, fmt.Errorf("error charging: %w", err)
	}
	lab.Mark(ctx, lab.PhaseCharge)
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return lab.Response{}, fmt.Errorf("error committing charge: %w", err)
	}
	if tag.String() != "COMMIT" {
		return lab.Response{}, fmt.Errorf("error committing charge: the transaction was rolled back (%s)", tag)
	}
	body := make([]byte, 0, len(before)+20+len(after))
	body = append(strconv.AppendInt(append(body, before...), c.BalanceCents, 10), after...)
	return lab.Response{Status: http.StatusCreated, Body: body}, nil
}

// aroundBalance splits the charge's response where its balance goes: the
// same charge rendered with balances 0 and 1 differs in that one byte.
func aroundBalance(c lab.Charge) (before, after []byte, ok bool) {
	c.BalanceCents = 0
	zero := lab.ChargeResponse(c).Body
	c.BalanceCents = 1
	one := lab.ChargeResponse(c).Body
	if len(zero) != len(one) {
		return nil, nil, false
	}
	i := 0
	for i < len(zero) && zero[i] == one[i] {
		i++
	}
	if i == len(zero) || zero[i] != '0' || one[i] != '1' || !bytes.Equal(zero[i+1:], one[i+1:]) {
		return nil, nil, false
	}
	return zero[:i], zero[i+1:], true
}

// keyRow is a committed key as a loser reads it.
type keyRow struct {
	fingerprint, state string
	status             *int
	body               []byte
	expired            bool
}

// readKeySQL reads a key row as a loser sees it ($1..$3 the scope, $4 now).
const readKeySQL = `
	SELECT request_fingerprint, state, response_status, response_body, expires_at <= $4
	FROM idempotency_requests WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3`

func (k *keyRow) scan(row pgx.Row) error {
	return row.Scan(&k.fingerprint, &k.state, &k.status, &k.body, &k.expired)
}

func (s *Store) readKey(ctx context.Context, tx pgdb.Querier, sc lab.Scope, now time.Time) (keyRow, error) {
	var k keyRow
	err := k.scan(tx.QueryRow(ctx, s.q(readKeySQL), sc.Tenant, sc.Endpoint, sc.Key, now))
	return k, err
}

// claim makes this transaction the key's owner, or returns the live row
// that stops it. The INSERT waits for an owner still in flight (bounded by
// lock_timeout); a committed row is not locked, so replays never queue
// behind each other. A row past its retention is taken over by a
// conditional UPDATE, which re-checks the expiry after any concurrent
// take-over commits.
func (s *Store) claim(ctx context.Context, tx *pgxpool.Conn, a lab.Attempt, now time.Time, retention time.Duration, lockTimeoutMS string) (bool, keyRow, error) {
	sc := a.Scope
	for try := 0; try < 3; try++ {
		insert := s.q(`
			INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint, state, created_at, expires_at)
			VALUES ($1, $2, $3, $4, 'in_flight', $6::timestamptz, $6::timestamptz + make_interval(secs => $5))
			ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING
			RETURNING true`)
		var (
			err  error
			row  keyRow
			read error
		)
		if try == 0 {
			// The key's row comes in the same round trip: a twin that waited
			// on the INSERT, or a replay, answers from it at once.
			row, read, err = s.begin(ctx, tx, lockTimeoutMS, insert, sc, a.Fingerprint, retention.Seconds(), now)
		} else {
			err = tx.QueryRow(ctx, insert, sc.Tenant, sc.Endpoint, sc.Key, a.Fingerprint, retention.Seconds(), now).Scan(new(bool))
			if errors.Is(err, pgx.ErrNoRows) {
				row, read = s.readKey(ctx, tx, sc, now)
			}
		}
		if err == nil {
			return true, keyRow{}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return false, keyRow{}, fmt.Errorf("error claiming key: %w", err)
		}
		err = read
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // swept between the two statements: insert again
		case err != nil:
			return false, row, fmt.Errorf("error reading key: %w", err)
		case !row.expired:
			return false, row, nil
		}
		err = tx.QueryRow(ctx, s.q(`
			UPDATE idempotency_requests
			SET request_fingerprint = $4, state = 'in_flight', response_status = NULL, response_body = NULL,
			    resource_id = NULL, created_at = $6::timestamptz, expires_at = $6::timestamptz + make_interval(secs => $5)
			WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND expires_at <= $6
			RETURNING true`), sc.Tenant, sc.Endpoint, sc.Key, a.Fingerprint, retention.Seconds(), now).Scan(new(bool))
		switch {
		case err == nil:
			return true, keyRow{}, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return false, row, fmt.Errorf("error taking over expired key: %w", err)
		}
		// Someone else took it over first: answer from theirs.
		if row, err = s.readKey(ctx, tx, sc, now); err == nil {
			return false, row, nil
		} else if !errors.Is(err, pgx.ErrNoRows) {
			return false, row, fmt.Errorf("error reading key: %w", err)
		}
	}
	return false, keyRow{}, &lab.InProgressError{RetryAfter: time.Second}
}

// begin sends BEGIN, the transaction's lock timeout, the claim's INSERT
// and a read of the key's row in one round trip. It returns the INSERT's
// answer last (pgx.ErrNoRows when the key exists), and before it the row
// as the read found it once the INSERT was done: committed by a twin it
// waited for, or this transaction's own claim (not used).
func (s *Store) begin(ctx context.Context, conn *pgxpool.Conn, lockTimeoutMS, insert string, sc lab.Scope, fingerprint string, retentionSecs float64, now time.Time) (row keyRow, readErr, claimErr error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue("SELECT set_config('lock_timeout', $1, true)", lockTimeoutMS) // SET LOCAL, with a parameter
	b.Queue(insert, sc.Tenant, sc.Endpoint, sc.Key, fingerprint, retentionSecs, now)
	b.Queue(s.q(readKeySQL), sc.Tenant, sc.Endpoint, sc.Key, now)
	br := conn.SendBatch(ctx, b)
	_, err := br.Exec()
	if err != nil {
		err = fmt.Errorf("error beginning transaction: %w", err)
	} else if _, err = br.Exec(); err != nil {
		err = fmt.Errorf("error setting lock_timeout: %w", err)
	} else {
		err = br.QueryRow().Scan(new(bool))
		if err == nil || errors.Is(err, pgx.ErrNoRows) {
			readErr = row.scan(br.QueryRow())
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("error beginning transaction: %w", cerr)
	}
	return row, readErr, err
}

// replay answers from the committed row: the stored response, or 422.
func replay(a lab.Attempt, k keyRow) (lab.Outcome, error) {
	switch {
	case k.fingerprint != a.Fingerprint:
		return lab.Outcome{}, lab.ErrKeyReused
	case k.state != lab.KeyCompleted || k.status == nil:
		return lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
	}
	return lab.Outcome{Response: lab.Response{Status: *k.status, Body: k.body}, Replayed: true}, nil
}

func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03" // lock_not_available
}

// Lookup reports one key's state.
func (s *Store) Lookup(ctx context.Context, sc lab.Scope) (lab.KeyState, error) {
	k := lab.KeyState{Tenant: sc.Tenant, Key: sc.Key}
	var live bool
	err := s.pool.QueryRow(ctx, sc.Namespace, s.q(`
		SELECT state, request_fingerprint, coalesce(response_status, 0), response_body, created_at, expires_at,
		       (extract(epoch FROM $4::timestamptz - created_at) * 1000)::bigint, expires_at > $4
		FROM idempotency_requests WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3`),
		sc.Tenant, sc.Endpoint, sc.Key, s.now()).Scan(&k.State, &k.Fingerprint, &k.Status, &k.Response, &k.CreatedAt, &k.ExpiresAt, &k.AgeMS, &live)
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && !live:
		return lab.KeyState{Tenant: sc.Tenant, Key: sc.Key, State: lab.KeyAbsent}, nil
	case err != nil:
		return lab.KeyState{}, fmt.Errorf("error reading key: %w", err)
	}
	return k, nil
}

// Keys lists the newest keys.
func (s *Store) Keys(ctx context.Context, ns lab.Namespace, limit int) ([]lab.KeyState, int, error) {
	var total int
	// Counted up to maxCounted, so a listing costs what it lists and not
	// what the table holds; the listing itself walks the (namespace,
	// created_at) index for limit rows.
	if err := s.pool.QueryRow(ctx, ns, s.q(`SELECT count(*) FROM (SELECT 1 FROM idempotency_requests WHERE `+pgdb.InNamespace(ns, 1)+` LIMIT $2) AS k`),
		string(ns), maxCounted).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("error counting keys: %w", err)
	}
	rows, err := s.pool.Query(ctx, ns, s.q(`
		SELECT tenant_id, idempotency_key, state, request_fingerprint, coalesce(response_status, 0), created_at, expires_at,
		       (extract(epoch FROM $2::timestamptz - created_at) * 1000)::bigint
		FROM idempotency_requests WHERE `+pgdb.InNamespace(ns, 3)+` ORDER BY created_at DESC LIMIT $1`), limit, s.now(), string(ns))
	if err != nil {
		return nil, 0, fmt.Errorf("error listing keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (lab.KeyState, error) {
		var k lab.KeyState
		err := row.Scan(&k.Tenant, &k.Key, &k.State, &k.Fingerprint, &k.Status, &k.CreatedAt, &k.ExpiresAt, &k.AgeMS)
		return k, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("error listing keys: %w", err)
	}
	return keys, total, nil
}

// Reset deletes every key row.
func (s *Store) Reset(ctx context.Context, ns lab.Namespace) error {
	if _, err := s.pool.Exec(ctx, ns, s.q(`DELETE FROM idempotency_requests WHERE $1 = '' OR namespace = $1`), string(ns)); err != nil {
		return fmt.Errorf("error deleting keys: %w", err)
	}
	return nil
}

// Restart kills the database sessions serving the region's namespace, as a
// server restart would kill every session: their open transactions roll
// back, committed rows stay. Nothing durable is lost, so a region confined
// to a key prefix loses no more than its namespace's sessions in flight,
// whose retries are safe. Another namespace's sessions are not touched.
// With "" it kills every session of this lab (the admin's restart).
func (s *Store) Restart(ctx context.Context, r lab.Region) error {
	ns := r.Namespace
	if ns == "" {
		if _, err := s.pool.Exec(ctx, pgdb.Background, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE application_name = $1 AND pid <> pg_backend_pid()`, s.appName); err != nil {
			return fmt.Errorf("error terminating sessions: %w", err)
		}
		s.reset() // the pools' idle connections are dead: drop them
		return nil
	}
	pids := s.pool.Serving(ns) // every store's on this pool: a restart kills them all
	if len(pids) == 0 {
		return nil // nothing in flight: a restart loses nothing durable
	}
	// Their connections die with them; the pool discards each as it returns.
	if _, err := s.pool.Exec(ctx, pgdb.Background, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid`, pids); err != nil {
		return fmt.Errorf("error terminating sessions: %w", err)
	}
	return nil
}

// maxCounted bounds the count of keys a listing reports.
const maxCounted = 10_000

// sweepBatch bounds each DELETE so the sweeper never holds long locks.
const sweepBatch = 1000

// Sweep deletes expired keys in bounded batches and reports how many.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	total := 0
	for {
		tag, err := s.pool.Exec(ctx, pgdb.Background, s.q(`
			DELETE FROM idempotency_requests WHERE ctid = ANY (ARRAY(
				SELECT ctid FROM idempotency_requests WHERE expires_at <= $2 LIMIT $1 FOR UPDATE SKIP LOCKED))`), sweepBatch, s.now())
		if err != nil {
			return total, fmt.Errorf("error sweeping keys: %w", err)
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < sweepBatch {
			return total, nil
		}
	}
}

// OldestInFlight reports how long the oldest charge transaction holding a
// claim has been open. The postgres store's in-flight keys are uncommitted
// rows nobody else can read, so their age is their transaction's, which
// PostgreSQL itself reports (server time: a gauge, not a verdict).
func (s *Store) OldestInFlight(ctx context.Context) (time.Duration, error) {
	var secs float64
	err := s.pool.QueryRow(ctx, pgdb.Background, s.q(`
		SELECT coalesce(extract(epoch FROM max(clock_timestamp() - a.xact_start)), 0)::float8
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.relation = 'idempotency_requests'::regclass AND l.mode = 'RowExclusiveLock' AND l.granted
		  AND a.application_name = $1 AND a.pid <> pg_backend_pid()`), s.appName).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("error reading the oldest claiming transaction: %w", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// Expiry reports when a completed key expires, for a cache that must not
// outlive it: only while the key still holds this fingerprint and this
// response (a take-over since would hold another), else false.
func (s *Store) Expiry(ctx context.Context, sc lab.Scope, fingerprint string, resp lab.Response) (time.Time, bool, error) {
	var at time.Time
	err := s.pool.QueryRow(ctx, sc.Namespace, s.q(`SELECT expires_at FROM idempotency_requests
		WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND state = 'completed'
		  AND request_fingerprint = $4 AND response_status = $5 AND response_body = $6`),
		sc.Tenant, sc.Endpoint, sc.Key, fingerprint, resp.Status, resp.Body).Scan(&at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return at, false, nil
	case err != nil:
		return at, false, fmt.Errorf("error reading the key's expiry: %w", err)
	}
	return at, true, nil
}
