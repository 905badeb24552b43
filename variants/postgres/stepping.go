package postgres

// What a stepped run asks of this design beyond its pause points: its
// transactions named for the attempt that opened them, so the stepper can
// say who waits on whom (pg_stat_activity, pg_blocking_pids) and end a lock
// wait on the server (pg_cancel_backend) at the "wait" move, as its
// lock_timeout would.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempotency-lab/lab/lab"
)

// nameStepped names a stepped attempt's transaction after it (for this
// transaction only); any other attempt's is left alone at no cost.
func nameStepped(ctx context.Context, tx pgx.Tx) error {
	name := lab.StepName(ctx)
	if name == "" {
		return nil
	}
	if _, err := tx.Exec(ctx, "SELECT set_config('application_name', $1, true)", name); err != nil {
		return fmt.Errorf("error naming the stepped transaction: %w", err)
	}
	return nil
}

// waitEnded reports a stepped attempt's lock wait cancelled by the "wait"
// move: the same end as a lock_timeout, while its client is still there.
func waitEnded(ctx context.Context, err error) bool {
	var pe *pgconn.PgError
	return lab.Stepped(ctx) && ctx.Err() == nil && errors.As(err, &pe) && pe.Code == "57014" // query_canceled
}

// MakeHappen makes a time-driven event happen to the key now. A stepped
// run's key is its id, and its attempts' transactions are named
// "<id>/<attempt>".
func (s *Store) MakeHappen(ctx context.Context, sc lab.Scope, e lab.TimeEvent) error {
	switch e {
	case lab.EventWait: // the lock waits of the run's attempts end now, as lock_timeout ends them
		_, err := s.pool.Exec(ctx, sc.Namespace, `
			SELECT pg_cancel_backend(pid) FROM pg_stat_activity
			WHERE starts_with(application_name, $1) AND wait_event_type = 'Lock'`, sc.Key+"/")
		if err != nil {
			return fmt.Errorf("%w: error ending the lock waits: %w", lab.ErrStoreUnavailable, err)
		}
		return nil
	case lab.EventWindow: // a completed key's retention ends now: the next attempt takes it over
		_, err := s.pool.Exec(ctx, sc.Namespace, s.q(`
			UPDATE idempotency_requests SET expires_at = $4
			WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND state = 'completed'`),
			sc.Tenant, sc.Endpoint, sc.Key, s.now())
		if err != nil {
			return fmt.Errorf("%w: error ending the key's retention: %w", lab.ErrStoreUnavailable, err)
		}
		return nil
	}
	return lab.Invalid("event", "%s has no %s: a key in flight is a row its owner's open transaction holds, and it ends with that transaction", Name, e)
}

// TimeMoves are the events a postgres key lives by: its retention, and the
// lock waits of its twins.
func (s *Store) TimeMoves() []lab.TimeEvent { return []lab.TimeEvent{lab.EventWindow, lab.EventWait} }

// Inspect reads the key as the server holds it: the committed row, and the
// run's open transactions with whoever they wait on. An uncommitted claim
// is seen only as its transaction, holding the unique index entry.
func (s *Store) Inspect(ctx context.Context, sc lab.Scope) (lab.KeyInspection, error) {
	in := lab.KeyInspection{Where: "PostgreSQL, " + s.table, State: lab.KeyAbsent, Facts: []string{}, Shared: true}
	var (
		state           string
		status          *int
		expires, create time.Time
	)
	err := s.pool.QueryRow(ctx, sc.Namespace, s.q(`
		SELECT state, response_status, created_at, expires_at FROM idempotency_requests
		WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3`), sc.Tenant, sc.Endpoint, sc.Key).
		Scan(&state, &status, &create, &expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		in.Facts = append(in.Facts, "no committed row for the key")
	case err != nil:
		return in, fmt.Errorf("%w: error reading the key: %w", lab.ErrStoreUnavailable, err)
	default:
		in.State = state
		fact := "committed row: " + state
		if status != nil {
			fact += fmt.Sprintf(", response %d stored", *status)
		}
		if left := expires.Sub(s.now()); left > 0 {
			fact += ", retention ends in " + left.Round(time.Second).String()
		} else {
			fact += ", past its retention"
		}
		in.Facts = append(in.Facts, fact)
	}
	rows, err := s.pool.Query(ctx, sc.Namespace, `
		SELECT application_name, state, coalesce(wait_event_type, ''), coalesce(wait_event, ''),
		       ARRAY(SELECT b.application_name FROM pg_stat_activity b WHERE b.pid = ANY(pg_blocking_pids(a.pid)))
		FROM pg_stat_activity a WHERE starts_with(application_name, $1) ORDER BY application_name`, sc.Key+"/")
	if err != nil {
		return in, fmt.Errorf("%w: error reading the run's transactions: %w", lab.ErrStoreUnavailable, err)
	}
	type backend struct {
		name, state, waitType, wait string
		blockers                    []string
	}
	backends, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (backend, error) {
		var b backend
		return b, r.Scan(&b.name, &b.state, &b.waitType, &b.wait, &b.blockers)
	})
	if err != nil {
		return in, fmt.Errorf("%w: error reading the run's transactions: %w", lab.ErrStoreUnavailable, err)
	}
	for _, b := range backends {
		who := attemptOf(b.name)
		switch {
		case b.waitType == "Lock" && len(b.blockers) > 0:
			var by []string
			for _, name := range b.blockers {
				by = append(by, attemptOf(name))
			}
			on := fmt.Sprintf("the key's unique index entry (a %s lock), held by %s's open transaction", b.wait, strings.Join(by, ", "))
			in.Facts = append(in.Facts, who+" waits on "+on)
			if in.Blocked == nil {
				in.Blocked = map[string]string{}
			}
			in.Blocked[strings.TrimPrefix(who, "attempt ")] = on
		default:
			in.Facts = append(in.Facts, fmt.Sprintf("%s's transaction is open (%s)", who, b.state))
			if in.State == lab.KeyAbsent {
				in.State = lab.KeyInFlight + " (uncommitted)"
			}
		}
	}
	return in, nil
}

// attemptOf names the attempt a stepped transaction belongs to.
func attemptOf(applicationName string) string {
	if _, n, ok := strings.Cut(applicationName, "/"); ok {
		return "attempt " + n
	}
	return applicationName
}
