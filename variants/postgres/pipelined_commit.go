// Pipelined commit: the transaction of store.go in two round trips instead
// of eight. BEGIN, the lock timeout, the claim's INSERT and the read of the
// key's row go together; then one statement charges the balance, writes the
// ledger entry and the outbox event and completes the key, sent with
// COMMIT. The account's row lock, on which its charges queue, is held from
// that statement to the commit without waiting on this process.
//
// What it buys, in lab bench's fresh phases (postgres, 1 replica, 16
// connections, 3 s phases): medians of 7 runs, each build in turn, on a
// shared 2-core machine whose runs differ by 15-40 %; charges/s and p50:
//
//	                              1,000 accounts    one hot account
//	plain path                    490/s  23.5 ms    167/s  58.7 ms
//	this optimisation alone       630/s  17.0 ms    248/s  38.5 ms   +29 %, +49 %
//	one-statement replay alone    523/s  19.0 ms    194/s  47.6 ms
//	both (the default)            742/s  16.2 ms    240/s  45.8 ms   +42 %, +24 % over the replay alone
//
// A replay that reaches the transaction gains too (two requests instead
// of five): 1,087 replays/s alone against 840 plain. The first and last
// rows come from
//
//	go run ./cmd/lab bench -stores postgres -replicas 1 -duration 3s -ceilings=false -attempt-runs 0 -plain-paths on
//
// and the same with -plain-paths off; the rows of one optimisation alone
// from a build with the other one turned off.
//
// TestPipelinedChargeAnswersWhatItStores (fastpath_internal_test.go) holds
// its answers to what the ledger and the key store, alternating with the
// step-by-step path on one account; TestPlainAndOptimisedAgree
// (plain_test.go) and TestConformancePlain run the same scenarios on both
// paths.

package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
)

// errTakeSlowPath says the pipelined charge rolled back on a case it leaves
// to the step-by-step transaction: the charge id or the order already in
// the ledger, or a deadlock with a twin taking the other path.
var errTakeSlowPath = errors.New("postgres: the pipelined charge rolled back; charging step by step")

// chargePipelined is chargeStepByStep in two round trips, falling back to
// it for what the one statement does not decide.
func (s *Store) chargePipelined(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	if a.Faults.Has(lab.FaultOutboxFail) {
		return s.chargeStepByStep(ctx, a) // the fault fails the outbox INSERT on its own
	}
	out, err := s.tryPipelined(ctx, a)
	if errors.Is(err, errTakeSlowPath) {
		return s.chargeStepByStep(ctx, a)
	}
	return out, err
}

func (s *Store) tryPipelined(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	conn, start, err := s.acquire(ctx, a.Scope.Namespace)
	if err != nil {
		return lab.Outcome{}, err
	}
	defer conn.Release()
	if conn.Waited() {
		if out, ok, err := s.replayOn(ctx, conn.Conn, a); ok || err != nil {
			return out, err
		}
	}
	// BEGIN goes in the first batch, so the rollback is by hand. (A
	// connection released inside a transaction would be closed by the pool.)
	committed := false
	defer func() {
		if !committed {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	claimed, row, err := s.beginAndClaim(ctx, conn.Conn, a, s.lockWait(ctx, start), s.now())
	switch {
	case isLockTimeout(err):
		return lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
	case err != nil:
		return lab.Outcome{}, err
	case !claimed:
		return replay(a, row)
	}
	if err := s.work(ctx, conn, a, start); err != nil {
		return lab.Outcome{}, err
	}
	entry := lab.NewEntry(a, s.now())
	resp, err := s.chargeAndCommit(ctx, conn.Conn, a, entry, lab.NewReceiptEvent(entry, a.Faults))
	if err != nil {
		return lab.Outcome{}, err
	}
	committed = true
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		return lab.Outcome{}, lab.ErrCrash // committed; the response is lost on the way
	}
	return lab.Outcome{Response: resp}, nil
}

// beginAndClaim sends BEGIN, the transaction's lock timeout, the claim's
// INSERT and a read of the key's row in one round trip: a twin that waited
// on the INSERT, or a replay, answers from the row at once. An expired row,
// or one swept meanwhile, is left to claim, on the transaction now open.
func (s *Store) beginAndClaim(ctx context.Context, conn *pgxpool.Conn, a lab.Attempt, lockWait time.Duration, now time.Time) (bool, keyRow, error) {
	sc := a.Scope
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue("SELECT set_config('lock_timeout', $1, true)", strconv.FormatInt(lockWait.Milliseconds(), 10)) // SET LOCAL, with a parameter
	b.Queue(s.q(claimSQL), sc.Tenant, sc.Endpoint, sc.Key, a.Fingerprint, a.Faults.RetentionOr(s.window).Seconds(), now)
	b.Queue(s.q(readKeySQL), sc.Tenant, sc.Endpoint, sc.Key, now)
	br := conn.SendBatch(ctx, b)
	var (
		row               keyRow
		claimErr, readErr error
	)
	_, err := br.Exec()
	if err != nil {
		err = fmt.Errorf("error beginning transaction: %w", err)
	} else if _, err = br.Exec(); err != nil {
		err = fmt.Errorf("error setting lock_timeout: %w", err)
	} else if claimErr = br.QueryRow().Scan(new(bool)); claimErr == nil || errors.Is(claimErr, pgx.ErrNoRows) {
		readErr = row.scan(br.QueryRow())
	}
	if cerr := br.Close(); err == nil && cerr != nil && (claimErr == nil || errors.Is(claimErr, pgx.ErrNoRows)) {
		err = fmt.Errorf("error beginning transaction: %w", cerr)
	}
	switch {
	case err != nil:
		return false, keyRow{}, err
	case claimErr == nil:
		return true, keyRow{}, nil
	case !errors.Is(claimErr, pgx.ErrNoRows):
		return false, keyRow{}, fmt.Errorf("error claiming key: %w", claimErr)
	case readErr == nil && !row.expired:
		return false, row, nil
	case readErr != nil && !errors.Is(readErr, pgx.ErrNoRows):
		return false, row, fmt.Errorf("error reading key: %w", readErr)
	}
	return s.claim(ctx, conn, a, now)
}

// chargeAndCommit charges behind the claim in one statement, sent with
// COMMIT: the balance, the ledger entry (recording the balance), the outbox
// event and the stored response, which the statement completes with the
// balance it wrote. A charge id or order already in the ledger, or a
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
			return lab.Response{}, s.balanceLocked()
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
	if tag.String() != "COMMIT" { // COMMIT of an aborted transaction answers ROLLBACK
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
