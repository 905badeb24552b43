// Package phases is the design whose provider call is part of the request:
// the request runs in atomic phases, each committing its writes together
// with the key's recovery point (started → charge_created →
// provider_called → finished). The provider is called between two phases
// under a key derived from the charge, so a second call is a replay at the
// provider. A retry resumes from the recovery point its key reached instead
// of starting over, and a completer (completer.go) drives the keys whose
// client never came back to their end.
//
// While a request (or the completer) works on a key, the key is locked for
// a bounded time by a token that every phase's commit checks: a worker
// whose lock ended and was taken over commits nothing more.
//
// This file is the design, in order: phase one (the claim, or the take-over
// of a key whose lock ended), the phases that follow it, and the fence.
// Beside it: config.go, keys.go (what the lab reads of a key) and
// completer.go.
package phases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// The recovery points, in order: the last phase a key committed.
const (
	started        = "started"         // phase 1: the key is claimed and the request recorded
	chargeCreated  = "charge_created"  // phase 2: the ledger holds the charge, and the response is decided
	providerCalled = "provider_called" // phase 3: the provider captured it (its answer recorded)
	finished       = "finished"        // phase 4: the receipt event is in the outbox; retries replay
)

// Who finished a key.
const (
	byRequest   = "request"
	byCompleter = "completer"
)

// recorded is what phase one records of the request: all a retry or the
// completer needs to run the phases left.
type recorded struct {
	Request   lab.ChargeRequest `json:"request"`
	Run       string            `json:"run,omitempty"`
	Replica   string            `json:"replica,omitempty"`
	Retention time.Duration     `json:"retention_ns"` // of the finished key
}

// job is one worker's hold on a key: the lock's token, the recovery point
// the key stands at, and what it recorded.
type job struct {
	scope    lab.Scope
	token    int64
	point    string
	chargeID string
	req      recorded
	response lab.Response // decided in phase two
	lock     time.Duration
	by       string
}

// attempt is the job as the ledger's helpers take it.
func (j *job) attempt() lab.Attempt {
	return lab.Attempt{Scope: j.scope, Request: j.req.Request, Run: j.req.Run, Replica: j.req.Replica, Store: Name, ChargeID: j.chargeID}
}

// Charge runs phase one, then every phase the key has left.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	if err := lab.Pause(ctx, lab.PointBeforeClaim); err != nil {
		return lab.Outcome{}, err
	}
	j, out, err := s.claim(ctx, a)
	if err != nil || j == nil {
		return out, err
	}
	return s.run(ctx, j, a.Faults)
}

// claim is phase one, committed at once: a new key with its request
// recorded, or the take-over of a key whose lock ended (its request's
// retry resumes where the key stands), or of a finished key past its
// retention. It answers otherwise: a replay, 409 while the key is locked,
// 422 for another request on it.
func (s *Store) claim(ctx context.Context, a lab.Attempt) (*job, lab.Outcome, error) {
	sc := a.Scope
	lock := s.lock
	if a.Faults.ClaimTTL > 0 {
		lock = a.Faults.ClaimTTL
	}
	req := recorded{Request: a.Request, Run: a.Run, Replica: a.Replica, Retention: a.Faults.RetentionOr(s.window)}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, lab.Outcome{}, fmt.Errorf("error recording the request: %w", err)
	}
	for range 3 {
		// The lock runs from now: a claim is marked at that instant.
		claimed, now := lab.MarkBefore(ctx, lab.PhaseClaim), s.now()
		j := &job{scope: sc, point: started, chargeID: lab.NewChargeID(), req: req, lock: lock, by: byRequest}
		err := s.pool.QueryRow(ctx, sc.Namespace, `
			INSERT INTO phase_requests (tenant_id, endpoint, idempotency_key, request_fingerprint, request, recovery_point,
			                            lock_token, locked_until, charge_id, created_at, updated_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, 'started', nextval('phase_tokens'), $6::timestamptz + make_interval(secs => $7), $8, $6, $6,
			        $6::timestamptz + make_interval(secs => $9))
			ON CONFLICT (tenant_id, endpoint, idempotency_key) DO NOTHING
			RETURNING lock_token`,
			sc.Tenant, sc.Endpoint, sc.Key, a.Fingerprint, body, now, lock.Seconds(), j.chargeID, req.Retention.Seconds()).Scan(&j.token)
		if err == nil {
			claimed()
			if err := s.after(ctx, j, 1, a.Faults); err != nil {
				return nil, lab.Outcome{}, err
			}
			return j, lab.Outcome{}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, lab.Outcome{}, fmt.Errorf("error claiming key: %w", err)
		}
		r, err := s.read(ctx, sc, now)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // swept in between: insert again
		case err != nil:
			return nil, lab.Outcome{}, err
		case r.point == finished && !r.expired && r.fingerprint != a.Fingerprint:
			return nil, lab.Outcome{}, lab.ErrKeyReused
		case r.point == finished && !r.expired:
			if err := lab.Pause(ctx, lab.PointBeforeReplayRead); err != nil {
				return nil, lab.Outcome{}, err
			}
			lab.Mark(ctx, lab.PhaseReplay)
			return nil, lab.Outcome{Response: r.response(), Replayed: true}, nil
		case r.point != finished && r.point != started && r.fingerprint != a.Fingerprint:
			return nil, lab.Outcome{}, lab.ErrKeyReused // the key is bound to the charge it created
		case r.locked && r.fingerprint != a.Fingerprint:
			return nil, lab.Outcome{}, lab.ErrKeyReused
		case r.locked:
			// Come back soon: the lock bounds a stalled worker, while a
			// live one finishes in a few round trips.
			return nil, lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
		}
		// The lock ended (or the finished key's retention did): take the key
		// over with the next token, if nobody took it first.
		// At started nothing of the recorded request happened yet, and a
		// finished key is over: either starts over as this request.
		fresh := r.point == finished || r.point == started
		j.token, err = s.takeOver(ctx, sc, r.token, lock, now, fresh, a.Fingerprint, body, j.chargeID, req.Retention)
		if !fresh {
			j.point, j.chargeID, j.req, j.response = r.point, r.chargeID, r.req, r.response()
		}
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // another retry, or the completer, took it first: look again
		case err != nil:
			return nil, lab.Outcome{}, err
		}
		s.log.InfoContext(ctx, "key taken over", "key", sc.Key, "at", j.point, "token", j.token, "stale_token", r.token)
		if !fresh {
			lab.MarkDetail(ctx, lab.PhaseResume, "resumed at "+j.point)
			return j, lab.Outcome{}, nil
		}
		claimed()
		if err := s.after(ctx, j, 1, a.Faults); err != nil {
			return nil, lab.Outcome{}, err
		}
		return j, lab.Outcome{}, nil
	}
	return nil, lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
}

// takeOver gives the key the next token and a new lock, if its token is
// still old and its lock over (or, finished, its retention). When fresh,
// the key starts over as the given request; otherwise it keeps its
// recovery point, charge and request (and the rest is ignored).
func (s *Store) takeOver(ctx context.Context, sc lab.Scope, old int64, lock time.Duration, now time.Time,
	fresh bool, fingerprint string, request []byte, chargeID string, retention time.Duration) (int64, error) {
	var token int64
	var req *string // NULL unless fresh: the CASE below casts it
	if fresh {
		r := string(request)
		req = &r
	}
	err := s.pool.QueryRow(ctx, sc.Namespace, `
		UPDATE phase_requests
		SET lock_token = nextval('phase_tokens'), locked_until = $5::timestamptz + make_interval(secs => $6), updated_at = $5,
		    request_fingerprint = CASE WHEN $7 THEN $8 ELSE request_fingerprint END,
		    request = CASE WHEN $7 THEN $9::jsonb ELSE request END,
		    charge_id = CASE WHEN $7 THEN $10 ELSE charge_id END,
		    recovery_point = CASE WHEN $7 THEN 'started' ELSE recovery_point END,
		    capture_id = CASE WHEN $7 THEN NULL ELSE capture_id END,
		    response_status = CASE WHEN $7 THEN NULL ELSE response_status END,
		    response_body = CASE WHEN $7 THEN NULL ELSE response_body END,
		    completed_by = CASE WHEN $7 THEN NULL ELSE completed_by END,
		    created_at = CASE WHEN $7 AND recovery_point = 'finished' THEN $5 ELSE created_at END,
		    expires_at = CASE WHEN $7 THEN $5::timestamptz + make_interval(secs => $11) ELSE expires_at END
		WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND lock_token = $4
		  -- re-checked on the row as it is now: a holder that committed
		  -- meanwhile renewed its lock, and keeps the key
		  AND (recovery_point <> 'finished' AND locked_until <= $5 OR recovery_point = 'finished' AND expires_at <= $5)
		RETURNING lock_token`,
		sc.Tenant, sc.Endpoint, sc.Key, old, now, lock.Seconds(), fresh, fingerprint, req, chargeID, retention.Seconds()).Scan(&token)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("error taking over key: %w", err)
	}
	return token, err
}

// run runs the phases the key has left, each in its own transaction, and
// answers with the response decided in phase two. A phase that fails
// releases the lock, so a retry resumes at once from the last recovery
// point; a crash leaves the lock to end on its own.
func (s *Store) run(ctx context.Context, j *job, f lab.Faults) (lab.Outcome, error) {
	for j.point != finished {
		var err error
		var phase int
		switch j.point {
		case started:
			phase, err = 2, s.createCharge(ctx, j, f)
		case chargeCreated:
			phase, err = 3, s.callProvider(ctx, j, f)
		case providerCalled:
			phase, err = 4, s.finish(ctx, j, f)
		default:
			return lab.Outcome{}, fmt.Errorf("key %s: unknown recovery point %q", j.scope.Key, j.point)
		}
		switch {
		case errors.Is(err, errFenced):
			return s.fenced(ctx, j, f)
		case err != nil:
			s.release(j)
			return lab.Outcome{}, err
		}
		if err := s.after(ctx, j, phase, f); err != nil {
			return lab.Outcome{}, err
		}
	}
	return lab.Outcome{Response: j.response}, nil
}

// after is where an attempt may stop once phase committed: the injected
// crash, or a stepped run's pause at the recovery point.
func (s *Store) after(ctx context.Context, j *job, phase int, f lab.Faults) error {
	if j.by == byRequest && crashAfter(f) == phase {
		return lab.ErrCrash // the key stays at its recovery point, locked until the lock ends
	}
	if err := lab.Pause(ctx, recoveryPause[phase]); err != nil {
		s.release(j)
		return err
	}
	return nil
}

// recoveryPause is the stepped runs' pause point after each phase.
var recoveryPause = [...]lab.PausePoint{1: lab.PointAfterClaim, 2: lab.PointAfterCharge, 3: lab.PointAfterProviderCall, 4: lab.PointAfterFinish}

// crashAfter is the phase after which the attempt's fault kills it, 0 for
// none: crash_after_phase names it; a crash after the claim is one after
// phase one, and a crash after the charge (its response lost) one after
// everything committed.
func crashAfter(f lab.Faults) int {
	switch f.Point {
	case lab.FaultCrashAfterPhase:
		return f.Phase
	case lab.FaultCrashAfterClaim:
		return 1
	case lab.FaultCrashAfterCharge:
		return 4
	}
	return 0
}

// createCharge is phase two: the charge under the key's charge id (so a
// stale worker's second try is the same row) and the response it decides.
// An order already charged finishes the key with its 409 at once.
func (s *Store) createCharge(ctx context.Context, j *job, f lab.Faults) error {
	if err := f.Pause(ctx); err != nil { // the request's own work, before anything is charged
		return err
	}
	next := chargeCreated
	err := s.commitPhase(ctx, j, func(tx pgx.Tx) error {
		c, err := pgdb.ApplyTx(ctx, tx, lab.Apply{Entry: lab.NewEntry(j.attempt(), s.now())})
		var oc *lab.OrderConflictError
		switch {
		case errors.As(err, &oc):
			j.response, next = lab.OrderConflictResponse(oc), finished
		case err != nil:
			return err
		default:
			j.response = lab.ChargeResponse(c)
		}
		return s.advance(ctx, tx, j, next, "")
	})
	if err != nil {
		return err
	}
	lab.Mark(ctx, lab.PhaseCharge)
	return nil
}

// callProvider is phase three: the capture, outside any transaction, under
// the key derived from the charge, then its answer recorded. A capture
// whose answer is lost leaves the key at charge_created; the next try
// captures again and the provider replays the one capture.
func (s *Store) callProvider(ctx context.Context, j *job, f lab.Faults) error {
	var fault string
	if f.Has(lab.FaultAppliedResponseLost) && j.by == byRequest {
		fault = string(lab.FaultAppliedResponseLost)
	}
	entry := lab.NewEntry(j.attempt(), s.now())
	capture, err := s.provider.CaptureInline(ctx, *lab.NewReceiptEvent(entry, lab.Faults{}), fault)
	if err != nil {
		return fmt.Errorf("%w: the provider did not answer the capture of %s (the key stays at %s; a retry resumes there): %w",
			lab.ErrStoreUnavailable, j.chargeID, j.point, err)
	}
	err = s.commitPhase(ctx, j, func(tx pgx.Tx) error {
		return s.advance(ctx, tx, j, providerCalled, capture)
	})
	if err != nil {
		return err
	}
	lab.MarkDetail(ctx, lab.PhaseProvider, "captured "+capture)
	return nil
}

// finish is phase four: the receipt event in the outbox (its capture, made
// again by the relay under the same key, is a replay) and the key finished.
func (s *Store) finish(ctx context.Context, j *job, f lab.Faults) error {
	return s.commitPhase(ctx, j, func(tx pgx.Tx) error {
		if f.Has(lab.FaultOutboxFail) && j.by == byRequest {
			return lab.ErrOutboxWrite
		}
		if err := pgdb.InsertEvent(ctx, tx, lab.NewReceiptEvent(lab.NewEntry(j.attempt(), s.now()), lab.Faults{})); err != nil {
			return err
		}
		return s.advance(ctx, tx, j, finished, "")
	})
}

// commitPhase runs one phase's writes in a transaction of its own. The
// commit that finishes the key is marked as it is sent: a retry replays
// the response only after it.
func (s *Store) commitPhase(ctx context.Context, j *job, writes func(pgx.Tx) error) error {
	commit := func() {}
	err := s.pool.BeginTxFunc(ctx, j.scope.Namespace, pgdb.Short, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if err := writes(tx); err != nil {
			return err
		}
		if j.point == finished {
			commit = lab.MarkBefore(ctx, lab.PhaseCommit)
		}
		return nil
	})
	if err == nil {
		commit()
	}
	return err
}

// advance commits the key's next recovery point with the phase's writes,
// only if the key is still this worker's and where it read it; otherwise
// errFenced rolls the phase back. It renews the lock, and a finished key
// lets it go.
func (s *Store) advance(ctx context.Context, tx pgx.Tx, j *job, next, capture string) error {
	var status *int
	var body []byte
	if next == chargeCreated || next == finished && j.point == started {
		status, body = &j.response.Status, j.response.Body
	}
	now := s.now()
	tag, err := tx.Exec(ctx, `
		UPDATE phase_requests
		SET recovery_point = $6, updated_at = $7,
		    locked_until = CASE WHEN $6 = 'finished' THEN $7 ELSE $7::timestamptz + make_interval(secs => $8) END,
		    response_status = coalesce($9, response_status), response_body = coalesce($10, response_body),
		    capture_id = coalesce(nullif($11, ''), capture_id),
		    completed_by = CASE WHEN $6 = 'finished' THEN $12 END,
		    expires_at = CASE WHEN $6 = 'finished' THEN $7::timestamptz + make_interval(secs => $13) ELSE expires_at END
		WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND lock_token = $4 AND recovery_point = $5`,
		j.scope.Tenant, j.scope.Endpoint, j.scope.Key, j.token, j.point, next, now, j.lock.Seconds(), status, body, capture, j.by,
		j.req.Retention.Seconds())
	if err != nil {
		return fmt.Errorf("error recording recovery point %s: %w", next, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("key %s at %s, token %d: %w", j.scope.Key, j.point, j.token, errFenced)
	}
	j.point = next
	return nil
}

var errFenced = errors.New("the key's lock was taken over")

// fenced reports a phase the lock refused: this worker's lock ended and
// another took the key over, so the phase committed nothing. It records
// the refusal and answers with what the key holds now.
func (s *Store) fenced(ctx context.Context, j *job, f lab.Faults) (lab.Outcome, error) {
	level := slog.LevelWarn
	if f.Fence() || lab.Stepped(ctx) {
		level = slog.LevelInfo // the faults paused the worker or shortened its lease: the fence at work is the lesson
	}
	s.log.Log(ctx, level, "stale worker fenced out: its lock was taken over", "key", j.scope.Key, "token", j.token)
	lab.MarkDetail(ctx, lab.PhaseFenced, fmt.Sprintf("phase refused at %s: token %d is no longer the key's", j.point, j.token))
	if _, err := s.pool.Exec(ctx, j.scope.Namespace, `
		INSERT INTO fenced_writes (tenant_id, idempotency_key, stale_token, charge_id, run_id, refused_at) VALUES ($1, $2, $3, $4, $5, $6)`,
		j.scope.Tenant, j.scope.Key, j.token, j.chargeID, j.req.Run, s.now()); err != nil {
		return lab.Outcome{}, fmt.Errorf("error recording a fenced phase: %w", err)
	}
	r, err := s.read(ctx, j.scope, s.now())
	if err == nil && r.point == finished {
		lab.Mark(ctx, lab.PhaseReplay)
		return lab.Outcome{Response: r.response(), Replayed: true}, nil
	}
	return lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
}

// release ends this worker's lock on a key it stopped working on, so a
// retry resumes at once instead of waiting for the lock to end.
func (s *Store) release(j *job) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.pool.Exec(ctx, j.scope.Namespace, `
		UPDATE phase_requests SET locked_until = $5
		WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND lock_token = $4 AND recovery_point <> 'finished'`,
		j.scope.Tenant, j.scope.Endpoint, j.scope.Key, j.token, s.now()); err != nil {
		s.log.Warn("releasing a lock failed; it will end on its own", "key", j.scope.Key, "err", err)
	}
}
