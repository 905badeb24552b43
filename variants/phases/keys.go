package phases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// What the store reads of a key, for its phases and for the lab: one key's
// row, the newest keys of a namespace, and what clears them.

// row is a key as committed.
type row struct {
	fingerprint, point, chargeID, completedBy string
	req                                       recorded
	token                                     int64
	locked, expired                           bool
	lockedUntil                               time.Time
	status                                    *int
	body                                      []byte
}

func (r row) response() lab.Response {
	if r.status == nil {
		return lab.Response{}
	}
	return lab.Response{Status: *r.status, Body: r.body}
}

// read is the key's row as of now; pgx.ErrNoRows when there is none.
func (s *Store) read(ctx context.Context, sc lab.Scope, now time.Time) (row, error) {
	var r row
	var req []byte
	err := s.pool.QueryRow(ctx, sc.Namespace, `
		SELECT request_fingerprint, recovery_point, charge_id, request, lock_token, locked_until > $4, expires_at <= $4, locked_until,
		       response_status, response_body, coalesce(completed_by, '')
		FROM phase_requests WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3`,
		sc.Tenant, sc.Endpoint, sc.Key, now).
		Scan(&r.fingerprint, &r.point, &r.chargeID, &req, &r.token, &r.locked, &r.expired, &r.lockedUntil, &r.status, &r.body, &r.completedBy)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return r, err
	case err != nil:
		return r, fmt.Errorf("error reading key: %w", err)
	}
	if err := json.Unmarshal(req, &r.req); err != nil {
		return r, fmt.Errorf("error reading the request recorded under key %s: %w", sc.Key, err)
	}
	return r, nil
}

// Lookup reports one key's state: completed once finished, in flight from
// the charge on (a retry resumes it, and nothing else may use the key), and
// in flight while a claim with nothing charged yet is locked. Such a claim
// whose lock ended, and a finished key past its retention, are absent: the
// next attempt takes them over as new.
func (s *Store) Lookup(ctx context.Context, sc lab.Scope) (lab.KeyState, error) {
	r, err := s.read(ctx, sc, s.now())
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && (r.point == finished && r.expired || r.point == started && !r.locked):
		return lab.KeyState{Tenant: sc.Tenant, Key: sc.Key, State: lab.KeyAbsent}, nil
	case err != nil:
		return lab.KeyState{}, err
	}
	k := lab.KeyState{Tenant: sc.Tenant, Key: sc.Key, State: lab.KeyInFlight, Fingerprint: r.fingerprint, RecoveryPoint: r.point}
	if r.point == finished {
		resp := r.response()
		k.State, k.Status, k.Response, k.CompletedBy = lab.KeyCompleted, resp.Status, resp.Body, r.completedBy
	}
	return k, nil
}

// maxCounted bounds the key count of a listing.
const maxCounted = 10_000

// Keys lists the namespace's newest keys ("" for every namespace's), each
// with its recovery point and who finished it.
func (s *Store) Keys(ctx context.Context, ns lab.Namespace, limit int) ([]lab.KeyState, int, error) {
	var total int
	if err := s.pool.QueryRow(ctx, ns, `SELECT count(*) FROM (SELECT 1 FROM phase_requests WHERE `+pgdb.InNamespace(ns, 1)+` LIMIT $2) AS k`,
		string(ns), maxCounted).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("error counting keys: %w", err)
	}
	rows, err := s.pool.Query(ctx, ns, `
		SELECT tenant_id, idempotency_key, CASE WHEN recovery_point = 'finished' THEN 'completed' ELSE 'in_flight' END,
		       recovery_point, coalesce(completed_by, ''), request_fingerprint, coalesce(response_status, 0), created_at, expires_at,
		       (extract(epoch FROM $2::timestamptz - created_at) * 1000)::bigint
		FROM phase_requests WHERE `+pgdb.InNamespace(ns, 3)+` ORDER BY created_at DESC LIMIT $1`, limit, s.now(), string(ns))
	if err != nil {
		return nil, 0, fmt.Errorf("error listing keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (lab.KeyState, error) {
		var k lab.KeyState
		err := row.Scan(&k.Tenant, &k.Key, &k.State, &k.RecoveryPoint, &k.CompletedBy, &k.Fingerprint, &k.Status, &k.CreatedAt, &k.ExpiresAt, &k.AgeMS)
		return k, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("error listing keys: %w", err)
	}
	return keys, total, nil
}

// Reset deletes the namespace's keys ("" for every key).
func (s *Store) Reset(ctx context.Context, ns lab.Namespace) error {
	if _, err := s.pool.Exec(ctx, ns, `DELETE FROM phase_requests WHERE $1 = '' OR namespace = $1`, string(ns)); err != nil {
		return fmt.Errorf("error deleting keys: %w", err)
	}
	return nil
}

// Sweep deletes finished keys past their retention, in batches. A key
// short of finished stays, whatever its age: it holds a request the
// completer still owes its end.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	tag, err := s.pool.Exec(ctx, pgdb.Background, `
		DELETE FROM phase_requests WHERE ctid IN (
			SELECT ctid FROM phase_requests WHERE recovery_point = 'finished' AND expires_at <= $1 LIMIT 1000)`, s.now())
	if err != nil {
		return 0, fmt.Errorf("error sweeping keys: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// OldestInFlight reports the age of the oldest key short of finished: a
// request still working, or one a crash left for a retry or the completer.
func (s *Store) OldestInFlight(ctx context.Context) (time.Duration, error) {
	var secs float64
	err := s.pool.QueryRow(ctx, pgdb.Background, `
		SELECT coalesce(extract(epoch FROM $1::timestamptz - min(created_at)), 0)::float8
		FROM phase_requests WHERE recovery_point <> 'finished'`, s.now()).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("error reading the oldest key in flight: %w", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}
