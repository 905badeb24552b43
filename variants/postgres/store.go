// Package postgres is the design that holds: key, ledger entry, outbox event
// and stored response committed in one PostgreSQL transaction.
//
// This file is the design, one statement at a time, and the path every
// attempt takes: the claim, the charge, the completion and the replay.
// Beside it: bounded_wait.go (the connection and the twin's lock, within the
// bounded wait), work.go (the slow fault), keys.go (what /idempotency/state
// shows), stepping.go (what a stepped run reads and moves).
package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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

// Charge decides one attempt. A connection dropped before the outcome is
// known is retried: the key makes the retry safe.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	var (
		out lab.Outcome
		err error
	)
	for try := 0; try < 3; try++ {
		out, err = s.charge(ctx, a)
		if err == nil || !pgdb.ConnectionLost(err) || ctx.Err() != nil {
			break
		}
	}
	return out, err
}

// charge is the design: claim, charge and complete in one transaction, or
// replay what the key's owner committed.
func (s *Store) charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	// Before the connection is taken: a pause here holds nothing.
	if err := lab.Pause(ctx, lab.PointBeforeClaim); err != nil {
		return lab.Outcome{}, err
	}
	conn, start, err := s.acquire(ctx, a.Scope.Namespace)
	if err != nil {
		return lab.Outcome{}, err
	}
	defer conn.Release()
	// READ COMMITTED whatever the server's default: after waiting for a
	// twin, the claim must see the row the twin committed.
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return lab.Outcome{}, fmt.Errorf("error beginning transaction: %w", err)
	}
	// Every early return rolls back, injected crashes included, as the
	// server would on a dead session: the claim goes with it.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// A twin's row lock is waited for only as long as the bounded wait has left.
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", s.lockWait(ctx, start).Milliseconds())); err != nil {
		return lab.Outcome{}, fmt.Errorf("error setting lock_timeout: %w", err)
	}
	if err := nameStepped(ctx, tx); err != nil {
		return lab.Outcome{}, err
	}

	// 1. Claim: the INSERT makes this transaction the key's owner, or
	// returns the row of the owner that came first.
	claimed, row, err := s.claim(ctx, tx, a, s.now())
	switch {
	case isLockTimeout(err) || waitEnded(ctx, err):
		return lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
	case err != nil:
		return lab.Outcome{}, err
	case !claimed:
		return replay(ctx, a, row) // 4. Replay
	}
	if err := lab.Pause(ctx, lab.PointAfterClaim); err != nil {
		return lab.Outcome{}, err // rolled back: the claim goes with it
	}
	if err := s.work(ctx, conn, a, start); err != nil {
		return lab.Outcome{}, err
	}

	// 2. Charge, in the same transaction: INSERT INTO charges, INSERT INTO
	// outbox, then the account's balance (pgdb.ApplyTx). A charge id or an
	// order already in the ledger is answered, not aborted.
	entry := lab.NewEntry(a, s.now())
	c, err := pgdb.ApplyTx(ctx, tx, lab.Apply{Entry: entry, Event: lab.NewReceiptEvent(entry, a.Faults), FailOutbox: a.Faults.Has(lab.FaultOutboxFail)})
	var resp lab.Response
	var oc *lab.OrderConflictError
	switch {
	case errors.As(err, &oc):
		resp = lab.OrderConflictResponse(oc) // a deterministic business outcome: stored and replayed
	case isLockTimeout(err):
		return lab.Outcome{}, s.balanceLocked() // nothing is stored, and the client may retry
	case err != nil:
		return lab.Outcome{}, err
	default:
		lab.Mark(ctx, lab.PhaseCharge)
		resp = lab.ChargeResponse(c)
	}
	if err := lab.Pause(ctx, lab.PointAfterCharge); err != nil {
		return lab.Outcome{}, err // uncommitted: the charge rolls back with the key row
	}

	// 3. Complete: the response goes into the key's row, and key, charge,
	// outbox event and response commit together.
	if _, err := tx.Exec(ctx, s.q(`
		UPDATE idempotency_requests SET state = 'completed', response_status = $4, response_body = $5, resource_id = $6
		WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3`),
		a.Scope.Tenant, a.Scope.Endpoint, a.Scope.Key, resp.Status, resp.Body, c.ID); err != nil {
		return lab.Outcome{}, fmt.Errorf("error storing response: %w", err)
	}
	commit := lab.MarkBefore(ctx, lab.PhaseCommit) // as the COMMIT is sent: no twin reads the row sooner
	if err := tx.Commit(ctx); err != nil {
		return lab.Outcome{}, fmt.Errorf("error committing charge: %w", err)
	}
	commit()
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		return lab.Outcome{}, lab.ErrCrash // committed; the response is lost on the way
	}
	return lab.Outcome{Response: resp}, nil
}

// claimSQL inserts the key in flight ($1..$3 the scope, $4 the fingerprint,
// $5 the retention in seconds, $6 now). It answers true when this
// transaction is the owner, and no row when the key exists. It waits for an
// owner still in flight (bounded by lock_timeout); a committed row is not
// locked, so replays never queue behind each other.
const claimSQL = `
	INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint, state, created_at, expires_at)
	VALUES ($1, $2, $3, $4, 'in_flight', $6::timestamptz, $6::timestamptz + make_interval(secs => $5))
	ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING
	RETURNING true`

// readKeySQL reads a key row as a loser sees it ($1..$3 the scope, $4 now).
const readKeySQL = `
	SELECT request_fingerprint, state, response_status, response_body, expires_at <= $4
	FROM idempotency_requests WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3`

// claim makes tx the key's owner, or returns the live row that stops it. A
// row past its retention is taken over by a conditional UPDATE, which
// re-checks the expiry after any concurrent take-over commits.
func (s *Store) claim(ctx context.Context, tx pgdb.Querier, a lab.Attempt, now time.Time) (bool, keyRow, error) {
	sc := a.Scope
	retention := a.Faults.RetentionOr(s.window).Seconds()
	for try := 0; try < 3; try++ {
		err := tx.QueryRow(ctx, s.q(claimSQL), sc.Tenant, sc.Endpoint, sc.Key, a.Fingerprint, retention, now).Scan(new(bool))
		switch {
		case err == nil:
			return true, keyRow{}, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return false, keyRow{}, fmt.Errorf("error claiming key: %w", err)
		}
		if err := lab.Pause(ctx, lab.PointBeforeReplayRead); err != nil {
			return false, keyRow{}, err
		}
		row, err := s.readKey(ctx, tx, sc, now)
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
			RETURNING true`), sc.Tenant, sc.Endpoint, sc.Key, a.Fingerprint, retention, now).Scan(new(bool))
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

// keyRow is a committed key as a loser reads it.
type keyRow struct {
	fingerprint, state string
	status             *int
	body               []byte
	expired            bool
}

func (k *keyRow) scan(row pgx.Row) error {
	return row.Scan(&k.fingerprint, &k.state, &k.status, &k.body, &k.expired)
}

func (s *Store) readKey(ctx context.Context, tx pgdb.Querier, sc lab.Scope, now time.Time) (keyRow, error) {
	var k keyRow
	err := k.scan(tx.QueryRow(ctx, s.q(readKeySQL), sc.Tenant, sc.Endpoint, sc.Key, now))
	return k, err
}

// replay answers from the committed row: the stored response, or 422.
func replay(ctx context.Context, a lab.Attempt, k keyRow) (lab.Outcome, error) {
	switch {
	case k.fingerprint != a.Fingerprint:
		return lab.Outcome{}, lab.ErrKeyReused
	case k.state != lab.KeyCompleted || k.status == nil:
		return lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
	}
	lab.Mark(ctx, lab.PhaseReplay)
	return lab.Outcome{Response: lab.Response{Status: *k.status, Body: k.body}, Replayed: true}, nil
}
