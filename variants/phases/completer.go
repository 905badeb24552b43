package phases

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// completeBatch bounds the keys one pass of the completer takes.
const completeBatch = 16

// Complete is one pass of the completer: it takes over each key left short
// of finished whose lock has been over for completeAfter (its client had
// that long to retry first), with the next token, as a retry would, and
// runs the phases left; the key records completed_by = completer. Two
// completers (two processes) never work one key: only one take-over of a
// token succeeds.
func (s *Store) Complete(ctx context.Context) (int, error) {
	now := s.now()
	rows, err := s.pool.Query(ctx, pgdb.Background, `
		SELECT tenant_id, endpoint, idempotency_key FROM phase_requests
		WHERE recovery_point <> 'finished' AND locked_until <= $1::timestamptz - make_interval(secs => $2)
		ORDER BY updated_at LIMIT $3`, now, s.completeAfter.Seconds(), completeBatch)
	if err != nil {
		return 0, fmt.Errorf("error finding unfinished keys: %w", err)
	}
	scopes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (lab.Scope, error) {
		var sc lab.Scope
		err := row.Scan(&sc.Tenant, &sc.Endpoint, &sc.Key)
		sc.Namespace = lab.NamespaceOf(sc.Tenant)
		return sc, err
	})
	if err != nil {
		return 0, fmt.Errorf("error reading unfinished keys: %w", err)
	}
	done := 0
	var errs []error
	for _, sc := range scopes {
		ok, err := s.completeOne(ctx, sc)
		if err != nil {
			errs = append(errs, fmt.Errorf("key %s: %w", sc.Key, err))
		}
		if ok {
			done++
		}
	}
	return done, errors.Join(errs...)
}

// completeOne finishes one key, unless a retry (or another completer) took
// it first.
func (s *Store) completeOne(ctx context.Context, sc lab.Scope) (bool, error) {
	now := s.now()
	r, err := s.read(ctx, sc, now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	case r.point == finished || r.locked:
		return false, nil // finished or taken meanwhile
	}
	token, err := s.takeOver(ctx, sc, r.token, s.lock, now, false, "", nil, "", 0)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	}
	j := &job{scope: sc, token: token, point: r.point, chargeID: r.chargeID, req: r.req, response: r.response(), lock: s.lock, by: byCompleter}
	from := j.point
	if _, err := s.run(ctx, j, lab.Faults{}); err != nil {
		return false, err
	}
	s.log.InfoContext(ctx, "completer finished a key", "key", sc.Key, "from", from, "charge_id", j.chargeID)
	return j.point == finished, nil
}

// CompleterLag is how long the oldest key the completer should have taken
// has waited beyond its threshold.
func (s *Store) CompleterLag(ctx context.Context) (time.Duration, error) {
	var secs float64
	err := s.pool.QueryRow(ctx, pgdb.Background, `
		SELECT coalesce(extract(epoch FROM $1::timestamptz - make_interval(secs => $2) - min(locked_until)), 0)::float8
		FROM phase_requests WHERE recovery_point <> 'finished' AND locked_until <= $1::timestamptz - make_interval(secs => $2)`,
		s.now(), s.completeAfter.Seconds()).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("error reading the completer's lag: %w", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}
