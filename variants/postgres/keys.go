// What the lab reads and does with the key table besides charging: one
// key's state, the newest keys, reset, restart, the sweeper and the gauges.

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
