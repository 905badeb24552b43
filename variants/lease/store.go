// Package lease is the two-phase design for long work: a short transaction
// claims the key with a lease and a fencing token, the work runs outside
// any transaction, and the charge is written carrying the token, which the
// ledger itself checks. A worker that outlived its lease is fenced out by
// the database, not by its own judgement.
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

// Name is the variant's name in the lab.
const Name lab.StoreName = "lease"

// Store claims keys in lease_requests and writes charges fenced by the
// claim's token.
type Store struct {
	pool   *pgdb.Pool    // every connection taken for a namespace, within its budget
	window time.Duration // retention of completed keys
	wait   time.Duration // how long a twin waits before 202 Accepted
	lease  time.Duration // default lifetime of a claim
	now    lab.Clock
	log    *slog.Logger
	// wake lets this process's twins of a claim look again as soon as it
	// settles here, rather than at their next poll.
	wake lab.Wakeups
}

// Config configures a Store; every field is required.
type Config struct {
	Pool   *pgdb.Pool // search_path is the lab's schema; one budget per namespace, shared with every store on it
	Window time.Duration
	Wait   time.Duration
	Lease  time.Duration
	Now    lab.Clock
	Logger *slog.Logger
}

// New returns the lease store.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.Pool == nil || cfg.Now == nil || cfg.Logger == nil:
		return nil, errors.New("lease: pool, clock and logger are required")
	case cfg.Window <= 0 || cfg.Wait <= 0 || cfg.Lease <= 0:
		return nil, fmt.Errorf("lease: window, wait and lease must be positive (got %s, %s, %s)", cfg.Window, cfg.Wait, cfg.Lease)
	}
	return &Store{pool: cfg.Pool, window: cfg.Window, wait: cfg.Wait, lease: cfg.Lease, now: cfg.Now, log: cfg.Logger}, nil
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// row is a key's committed claim.
type row struct {
	fingerprint, state, chargeID string
	token                        int64
	leaseOver, expired           bool
	leaseExpires                 time.Time
	status                       *int
	body                         []byte
}

// claim is what phase one won: the token to write with and the charge id.
type claim struct {
	token    int64
	chargeID string
}

// Charge runs phase one (claim), the work, and phase two (the fenced write).
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	lease := s.lease
	if a.Faults.ClaimTTL > 0 {
		lease = a.Faults.ClaimTTL
	}
	retention := a.Faults.RetentionOr(s.window)
	deadline := time.Now().Add(s.wait)
	backoff := 5 * time.Millisecond // a twin's work takes milliseconds: look again soon, then less often
	var cl claim
	for {
		won, r, err := s.claim(ctx, a, lease, retention)
		switch {
		case err != nil:
			return lab.Outcome{}, err
		case won != nil:
			cl = *won
		case r.fingerprint != a.Fingerprint:
			return lab.Outcome{}, lab.ErrKeyReused
		case r.state == lab.KeyCompleted:
			return lab.Outcome{Response: lab.Response{Status: *r.status, Body: r.body}, Replayed: true}, nil
		case time.Now().After(deadline):
			// Still working under a live lease: say where to look.
			return lab.Outcome{Pending: &lab.Operation{Key: a.Scope.Key, State: lab.KeyInFlight, Token: r.token, LeaseExpires: r.leaseExpires.UTC()}}, nil
		default:
			if err := s.wake.Wait(ctx, wakeKey(a.Scope), backoff); err != nil {
				return lab.Outcome{}, err
			}
			backoff = min(2*backoff, 20*time.Millisecond)
			continue
		}
		break
	}
	defer s.wake.Settled(wakeKey(a.Scope)) // however it ends, twins here look again now
	lab.Mark(ctx, lab.PhaseClaim)          // phase one committed
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		return lab.Outcome{}, lab.ErrCrash // the claim stays until its lease ends; then a retry takes over
	}
	// The work, outside any transaction: nothing is held while it runs. A
	// live worker renews its lease meanwhile, so slow work keeps its claim;
	// a stale worker (a pause of the whole process) renews nothing.
	stopRenewing := func() {}
	if !a.Faults.Has(lab.FaultStaleWorker) {
		stopRenewing = s.renew(ctx, a.Scope, cl, lease)
	}
	err := a.Faults.Pause(ctx)
	stopRenewing()
	if err != nil {
		s.release(a, cl)
		return lab.Outcome{}, err
	}
	// Once started, the write runs to its end even if the client leaves.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	out, err := s.write(wctx, a, cl, retention)
	var stale *staleError
	switch {
	case pgdb.StaleToken(err) || errors.As(err, &stale):
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

// renew extends the claim's lease every third of it while the work runs,
// for as long as the claim is still this worker's; the returned func stops
// it and waits until it stopped. A renewal that finds the token gone stops:
// the write will be fenced.
func (s *Store) renew(ctx context.Context, sc lab.Scope, cl claim, lease time.Duration) (stop func()) {
	every := max(lease/3, 10*time.Millisecond)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			tag, err := s.pool.Exec(ctx, sc.Namespace, `
				UPDATE lease_requests SET lease_expires_at = $5::timestamptz + make_interval(secs => $6)
				WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND attempt_token = $4 AND state = 'in_flight'`,
				sc.Tenant, sc.Endpoint, sc.Key, cl.token, s.now(), lease.Seconds())
			switch {
			case err != nil:
				s.log.WarnContext(ctx, "renewing a lease failed; trying again", "key", sc.Key, "err", err)
			case tag.RowsAffected() == 0:
				return // taken over: nothing left to renew
			default:
				lab.Mark(ctx, lab.PhaseRenew)
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// wakeKey names a key among the waits of this process.
func wakeKey(sc lab.Scope) string { return sc.Tenant + "\x00" + sc.Endpoint + "\x00" + sc.Key }

// claim is phase one, committed at once: a new key, or the take-over of a
// key whose lease ran out (or whose retention ended), with the next token.
// It returns the live row otherwise.
func (s *Store) claim(ctx context.Context, a lab.Attempt, lease, retention time.Duration) (*claim, row, error) {
	sc := a.Scope
	for try := 0; try < 3; try++ {
		now := s.now()
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
		takeOver := (r.state == lab.KeyInFlight && r.leaseOver) || (r.state == lab.KeyCompleted && r.expired)
		if !takeOver {
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
			s.log.InfoContext(ctx, "lease taken over", "key", sc.Key, "token", cl.token, "stale_token", r.token)
			return &cl, row{}, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, r, fmt.Errorf("error taking over key: %w", err)
		}
		// Another retry took it over first: look again.
	}
	return nil, row{}, &lab.InProgressError{RetryAfter: time.Second}
}

func (s *Store) read(ctx context.Context, sc lab.Scope, now time.Time) (row, error) {
	var r row
	err := s.pool.QueryRow(ctx, sc.Namespace, `
		SELECT request_fingerprint, state, charge_id, attempt_token, lease_expires_at <= $4, expires_at <= $4, lease_expires_at,
		       response_status, response_body
		FROM lease_requests WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3`,
		sc.Tenant, sc.Endpoint, sc.Key, now).
		Scan(&r.fingerprint, &r.state, &r.chargeID, &r.token, &r.leaseOver, &r.expired, &r.leaseExpires, &r.status, &r.body)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("error reading key: %w", err)
	}
	return r, err
}

// write is phase two: the charge carrying the claim's token (refused by
// the ledger when stale), its event and the stored response, in one
// transaction.
func (s *Store) write(ctx context.Context, a lab.Attempt, cl claim, retention time.Duration) (lab.Outcome, error) {
	var resp lab.Response
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
		return nil
	})
	if errors.Is(err, errStaleCompletion) {
		return lab.Outcome{}, &staleError{err}
	}
	if err != nil {
		return lab.Outcome{}, err
	}
	return lab.Outcome{Response: resp}, nil
}

var errStaleCompletion = errors.New("the claim's token is no longer the key's")

// staleError marks a completion refused for its token, as the ledger's
// refusal is marked.
type staleError struct{ err error }

func (e *staleError) Error() string { return e.err.Error() }
func (e *staleError) Unwrap() error { return e.err }

// fenced records and reports a write the fence refused: this worker's
// claim was taken over while it worked. It answers with what the key holds
// now.
func (s *Store) fenced(ctx context.Context, a lab.Attempt, cl claim, cause error) (lab.Outcome, error) {
	s.log.WarnContext(ctx, "stale worker fenced out: the ledger refused its write", "key", a.Scope.Key, "token", cl.token, "err", cause)
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

// Lookup reports one key's state: in flight while its lease is live (the
// claim is committed, so every replica sees it), completed once written.
// A claim whose lease ended, or that was released, is absent: the next
// attempt takes it over (the row stays, keeping the token rising).
func (s *Store) Lookup(ctx context.Context, sc lab.Scope) (lab.KeyState, error) {
	r, err := s.read(ctx, sc, s.now())
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && (r.state == lab.KeyCompleted && r.expired || r.state == lab.KeyInFlight && r.leaseOver):
		return lab.KeyState{Tenant: sc.Tenant, Key: sc.Key, State: lab.KeyAbsent}, nil
	case err != nil:
		return lab.KeyState{}, err
	}
	k := lab.KeyState{Tenant: sc.Tenant, Key: sc.Key, State: r.state, Fingerprint: r.fingerprint, Response: r.body}
	if r.status != nil {
		k.Status = *r.status
	}
	return k, nil
}

// Operation reports a key's operation: its state, token and lease, and the
// final answer once completed. lab.ErrOperationNotFound when absent.
func (s *Store) Operation(ctx context.Context, sc lab.Scope) (lab.Operation, error) {
	r, err := s.read(ctx, sc, s.now())
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return lab.Operation{}, fmt.Errorf("key %s: %w", sc.Key, lab.ErrOperationNotFound)
	case err != nil:
		return lab.Operation{}, err
	}
	op := lab.Operation{Key: sc.Key, State: r.state, Token: r.token, LeaseExpires: r.leaseExpires.UTC()}
	if r.state == lab.KeyCompleted && r.status != nil {
		op.Status, op.Body = *r.status, r.body
	}
	return op, nil
}

// maxCounted bounds the key count of a listing.
const maxCounted = 10_000

// Keys lists the namespace's newest keys ("" for every namespace's).
func (s *Store) Keys(ctx context.Context, ns lab.Namespace, limit int) ([]lab.KeyState, int, error) {
	var total int
	if err := s.pool.QueryRow(ctx, ns, `SELECT count(*) FROM (SELECT 1 FROM lease_requests WHERE `+pgdb.InNamespace(ns, 1)+` LIMIT $2) AS k`,
		string(ns), maxCounted).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("error counting keys: %w", err)
	}
	rows, err := s.pool.Query(ctx, ns, `
		SELECT tenant_id, idempotency_key, state, request_fingerprint, coalesce(response_status, 0), created_at, expires_at,
		       (extract(epoch FROM $2::timestamptz - created_at) * 1000)::bigint
		FROM lease_requests WHERE `+pgdb.InNamespace(ns, 3)+` ORDER BY created_at DESC LIMIT $1`, limit, s.now(), string(ns))
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

// Reset deletes the namespace's keys ("" for every key).
func (s *Store) Reset(ctx context.Context, ns lab.Namespace) error {
	if _, err := s.pool.Exec(ctx, ns, `DELETE FROM lease_requests WHERE $1 = '' OR namespace = $1`, string(ns)); err != nil {
		return fmt.Errorf("error deleting keys: %w", err)
	}
	return nil
}

// Sweep deletes keys past their retention, in batches (a claim abandoned
// that long is gone too).
func (s *Store) Sweep(ctx context.Context) (int, error) {
	tag, err := s.pool.Exec(ctx, pgdb.Background, `
		DELETE FROM lease_requests WHERE ctid IN (
			SELECT ctid FROM lease_requests WHERE expires_at <= $1 LIMIT 1000)`, s.now())
	if err != nil {
		return 0, fmt.Errorf("error sweeping keys: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// OldestInFlight reports the age of the oldest claim still in flight: its
// worker may be slow, paused, or dead with its lease not yet over.
func (s *Store) OldestInFlight(ctx context.Context) (time.Duration, error) {
	var secs float64
	err := s.pool.QueryRow(ctx, pgdb.Background, `
		SELECT coalesce(extract(epoch FROM $1::timestamptz - min(created_at)), 0)::float8
		FROM lease_requests WHERE state = 'in_flight'`, s.now()).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("error reading the oldest claim in flight: %w", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// Describe says where the keys live.
func (s *Store) Describe() string {
	return fmt.Sprintf("PostgreSQL table lease_requests: a committed claim with a %s lease and a fencing token the ledger checks", s.lease)
}
