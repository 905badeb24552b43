package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// What the store reads of a key, for its claims and for the lab: one
// key's row, its state and operation, the newest keys of a namespace, and
// what clears them.

// row is a key's committed claim.
type row struct {
	fingerprint, state, chargeID string
	token                        int64
	leaseOver, expired           bool
	leaseExpires                 time.Time
	status                       *int
	body                         []byte
}

// read is the key's row as of now; pgx.ErrNoRows when there is none.
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
