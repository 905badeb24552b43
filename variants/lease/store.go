// Package lease is the two-phase design for long work: a short transaction
// claims the key with a lease and a fencing token, the work runs outside
// any transaction, and the charge is written carrying the token, which the
// ledger itself checks. A worker that outlived its lease is fenced out by
// the database, not by its own judgement.
//
// This file is the design, in order: the claim, the renewal, the fenced
// write with its completion, the fence's refusal, the replay. Beside it:
// config.go, heartbeat.go, keys.go, twin_wait.go (a twin's
// bounded poll) and stepping.go (what a stepped run reads and moves).
// Twins poll: waking them at once (lab.Wakeups) made 64 concurrent
// attempts slower in lab bench.
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// claim is what phase one won: the token to write with and the charge id.
type claim struct {
	token    int64
	chargeID string
}

// Charge runs phase one (claim), the work, and phase two (the fenced write).
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	lease, retention := s.lease, a.Faults.RetentionOr(s.window)
	if a.Faults.ClaimTTL > 0 {
		lease = a.Faults.ClaimTTL
	}
	if err := lab.Pause(ctx, lab.PointBeforeClaim); err != nil {
		return lab.Outcome{}, err
	}
	cl, out, err := s.claimOrWait(ctx, a, lease, retention)
	if err != nil || cl.token == 0 { // tokens start at 1: no claim won
		return out, err
	}
	s.signals.claimed.Send(cl.token)
	s.hold(ctx, a.Scope, cl.token)
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		return lab.Outcome{}, lab.ErrCrash // the claim stays until its lease ends; then a retry takes over
	}
	if err := lab.Pause(ctx, lab.PointAfterClaim); err != nil {
		s.release(a, cl) // given up before any write, as failed work is
		return lab.Outcome{}, err
	}
	// The work, outside any transaction: nothing is held while it runs. A
	// live worker renews its lease meanwhile, so slow work keeps its claim;
	// a stale worker (a pause of the whole process) renews nothing, nor
	// does a stepped attempt: paused between moves, it stands for a stalled
	// worker, and the lease move ends its lease.
	stopRenewing := func() {}
	if !a.Faults.Has(lab.FaultStaleWorker) && !lab.Stepped(ctx) {
		stopRenewing = s.heartbeat(ctx, a.Scope, cl, lease)
	}
	err = a.Faults.Pause(ctx)
	stopRenewing()
	if err != nil {
		s.release(a, cl)
		return lab.Outcome{}, err
	}
	// Once started, the write runs to its end even if the client leaves.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	out, err = s.write(wctx, a, cl, retention)
	switch {
	case pgdb.StaleToken(err) || errors.Is(err, errStaleCompletion):
		return s.fenced(wctx, a, cl, err)
	case errors.Is(err, lab.ErrOutboxWrite):
		s.release(a, cl) // rolled back: the next retry takes over at once
		return lab.Outcome{}, err
	case err != nil:
		return lab.Outcome{}, err
	}
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		return lab.Outcome{}, lab.ErrCrash
	}
	return out, nil
}

// claim is phase one, committed at once: a new key, or the take-over of a
// key whose lease ran out (or whose retention ended), with the next token.
// It returns the live row otherwise.
func (s *Store) claim(ctx context.Context, a lab.Attempt, lease, retention time.Duration) (*claim, row, error) {
	sc := a.Scope
	for try := 0; try < 3; try++ {
		// The lease runs from now: the claim is marked at that instant.
		claimed, now := lab.MarkBefore(ctx, lab.PhaseClaim), s.now()
		cl := claim{chargeID: lab.NewChargeID()}
		err := s.pool.QueryRow(ctx, sc.Namespace, `
			INSERT INTO lease_requests (tenant_id, endpoint, idempotency_key, request_fingerprint, state, attempt_token,
			                            lease_expires_at, charge_id, created_at, expires_at)
			VALUES ($1, $2, $3, $4, 'in_flight', nextval('lease_tokens'), $6::timestamptz + make_interval(secs => $5), $7, $6,
			        $6::timestamptz + make_interval(secs => $8))
			ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING
			RETURNING attempt_token`,
			sc.Tenant, sc.Endpoint, sc.Key, a.Fingerprint, lease.Seconds(), now, cl.chargeID, retention.Seconds()).Scan(&cl.token)
		if err == nil {
			claimed()
			return &cl, row{}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, row{}, fmt.Errorf("error claiming key: %w", err)
		}
		r, err := s.read(ctx, sc, now)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // swept in between: insert again
		case err != nil:
			return nil, r, err
		}
		// An abandoned claim (its lease over) is taken over by whichever
		// request comes, as a completed key past its retention is: the
		// fence keeps its old holder from writing if it still lives.
		if !(r.state == lab.KeyInFlight && r.leaseOver) && !(r.state == lab.KeyCompleted && r.expired) {
			return nil, r, nil
		}
		// A higher token, if nobody took it first: the old holder's token
		// is stale from this commit on.
		err = s.pool.QueryRow(ctx, sc.Namespace, `
			UPDATE lease_requests
			SET attempt_token = nextval('lease_tokens'), state = 'in_flight', request_fingerprint = $4, charge_id = $7,
			    lease_expires_at = $6::timestamptz + make_interval(secs => $5), response_status = NULL, response_body = NULL,
			    created_at = CASE WHEN state = 'completed' THEN $6 ELSE created_at END,
			    expires_at = $6::timestamptz + make_interval(secs => $8)
			WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND attempt_token = $9
			  -- re-checked on the row as it is now: a holder that woke and
			  -- completed it meanwhile kept its token, and wins
			  AND ((state = 'in_flight' AND lease_expires_at <= $6) OR (state = 'completed' AND expires_at <= $6))
			RETURNING attempt_token`,
			sc.Tenant, sc.Endpoint, sc.Key, a.Fingerprint, lease.Seconds(), now, cl.chargeID, retention.Seconds(), r.token).Scan(&cl.token)
		switch {
		case err == nil:
			claimed()
			s.log.InfoContext(ctx, "lease taken over", "key", sc.Key, "token", cl.token, "stale_token", r.token)
			return &cl, row{}, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, r, fmt.Errorf("error taking over key: %w", err)
		}
		// Another retry took it over first: look again.
	}
	return nil, row{}, &lab.InProgressError{RetryAfter: time.Second}
}

// renew extends the claim's lease while the claim is still this worker's
// (false once it is not: the write will be fenced).
func (s *Store) renew(ctx context.Context, sc lab.Scope, cl claim, lease time.Duration) (bool, error) {
	tag, err := s.pool.Exec(ctx, sc.Namespace, `
		UPDATE lease_requests SET lease_expires_at = $5::timestamptz + make_interval(secs => $6)
		WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND attempt_token = $4 AND state = 'in_flight'`,
		sc.Tenant, sc.Endpoint, sc.Key, cl.token, s.now(), lease.Seconds())
	if err != nil {
		return false, fmt.Errorf("error renewing the lease: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// write is phase two: the charge carrying the claim's token (refused by
// the ledger when stale), its event and the stored response, in one
// transaction.
func (s *Store) write(ctx context.Context, a lab.Attempt, cl claim, retention time.Duration) (lab.Outcome, error) {
	var resp lab.Response
	var commit func()
	err := s.pool.BeginTxFunc(ctx, a.Scope.Namespace, pgdb.Short, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		a.ChargeID = cl.chargeID
		entry := lab.NewEntry(a, s.now())
		entry.FenceToken = cl.token
		c, err := pgdb.ApplyTx(ctx, tx, lab.Apply{Entry: entry, Event: lab.NewReceiptEvent(entry, a.Faults), FailOutbox: a.Faults.Has(lab.FaultOutboxFail)})
		var oc *lab.OrderConflictError
		switch {
		case errors.As(err, &oc):
			resp = lab.OrderConflictResponse(oc)
		case err != nil:
			return err
		default:
			lab.Mark(ctx, lab.PhaseCharge)
			resp = lab.ChargeResponse(c)
		}
		tag, err := tx.Exec(ctx, `
			UPDATE lease_requests SET state = 'completed', response_status = $5, response_body = $6
			WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND attempt_token = $4`,
			a.Scope.Tenant, a.Scope.Endpoint, a.Scope.Key, cl.token, resp.Status, resp.Body)
		if err != nil {
			return fmt.Errorf("error storing the response: %w", err)
		}
		if tag.RowsAffected() != 1 {
			// An order conflict writes no ledger row, so no fence ran:
			// the token is checked here instead.
			return fmt.Errorf("key %s: %w", a.Scope.Key, errStaleCompletion)
		}
		commit = lab.MarkBefore(ctx, lab.PhaseCommit) // as the COMMIT is sent: no twin reads the response sooner
		return nil
	})
	if err != nil {
		return lab.Outcome{}, err
	}
	commit()
	return lab.Outcome{Response: resp}, nil
}

var errStaleCompletion = errors.New("the claim's token is no longer the key's")

// fenced records and reports a write the fence refused: this worker's
// claim was taken over while it worked. It answers with what the key holds
// now.
func (s *Store) fenced(ctx context.Context, a lab.Attempt, cl claim, cause error) (lab.Outcome, error) {
	level := slog.LevelWarn
	if a.Faults.Fence() || lab.Stepped(ctx) {
		level = slog.LevelInfo // the faults paused the worker or shortened its lease: the fence at work is the lesson
	}
	s.log.Log(ctx, level, "stale worker fenced out: the ledger refused its write", "key", a.Scope.Key, "token", cl.token, "err", cause)
	r, err := s.read(ctx, a.Scope, s.now())
	detail := fmt.Sprintf("write refused: token %d is stale", cl.token)
	if err == nil {
		detail = fmt.Sprintf("write refused: token %d < %d", cl.token, r.token)
	}
	lab.MarkDetail(ctx, lab.PhaseFenced, detail)
	if _, err := s.pool.Exec(ctx, a.Scope.Namespace, `
		INSERT INTO fenced_writes (tenant_id, idempotency_key, stale_token, charge_id, run_id, refused_at) VALUES ($1, $2, $3, $4, $5, $6)`,
		a.Scope.Tenant, a.Scope.Key, cl.token, cl.chargeID, a.Run, s.now()); err != nil {
		return lab.Outcome{}, fmt.Errorf("error recording a fenced write: %w", err)
	}
	switch {
	case err == nil && r.state == lab.KeyCompleted && r.fingerprint != a.Fingerprint:
		return lab.Outcome{}, lab.ErrKeyReused // another request took the abandoned key over
	case err == nil && r.state == lab.KeyCompleted:
		lab.Mark(ctx, lab.PhaseReplay)
		return lab.Outcome{Response: lab.Response{Status: *r.status, Body: r.body}, Replayed: true}, nil
	}
	return lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
}

// release ends a claim whose work failed before any write, so a retry
// takes over at once instead of waiting for the lease.
func (s *Store) release(a lab.Attempt, cl claim) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.pool.Exec(ctx, a.Scope.Namespace, `
		UPDATE lease_requests SET lease_expires_at = $5
		WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND attempt_token = $4 AND state = 'in_flight'`,
		a.Scope.Tenant, a.Scope.Endpoint, a.Scope.Key, cl.token, s.now()); err != nil {
		s.log.Warn("releasing a claim failed; its lease will end on its own", "key", a.Scope.Key, "err", err)
	}
}
