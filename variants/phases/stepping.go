package phases

// What a stepped run reads and moves: the key's row (lab.KeyInspector),
// and the lock's end, the completer's turn and the window's end made to
// happen now (lab.TimeMover).

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-lab/lab/lab"
)

// TimeMoves are the events a phases key lives by.
func (s *Store) TimeMoves() []lab.TimeEvent {
	return []lab.TimeEvent{lab.EventLock, lab.EventCompleter, lab.EventWindow, lab.EventWait}
}

// MakeHappen makes a time-driven event happen to the key now, on the
// store's clock: its lock ends, the completer finishes it, or the
// retention window passes.
func (s *Store) MakeHappen(ctx context.Context, sc lab.Scope, ev lab.TimeEvent) error {
	now := s.now()
	var q string
	switch ev {
	case lab.EventLock: // the holder's token stays: its next phase will be refused
		q = `UPDATE phase_requests SET locked_until = $4
			WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND recovery_point <> 'finished' AND locked_until > $4`
	case lab.EventCompleter:
		// The lock ends now and this move's completer takes the key over at
		// once: the lab's own completer waits completeAfter past a lock, so
		// it cannot take the key between the two and leave this move
		// returning before the key is finished.
		q = `UPDATE phase_requests SET locked_until = $4
			WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND recovery_point <> 'finished'`
	case lab.EventWindow:
		q = `UPDATE phase_requests SET expires_at = $4
			WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND recovery_point = 'finished' AND expires_at > $4`
	case lab.EventWait:
		return nil // a twin is answered 409 at once: nothing waits
	default:
		return lab.Invalid("event", "phases has no %q to make happen: its key is bounded by a lock (the lock move) and finished by the completer (the completer move)", ev)
	}
	if _, err := s.pool.Exec(ctx, sc.Namespace, q, sc.Tenant, sc.Endpoint, sc.Key, now); err != nil {
		return fmt.Errorf("error making the %s happen: %w", ev, err)
	}
	if ev == lab.EventCompleter {
		if _, err := s.completeOne(ctx, sc); err != nil {
			return fmt.Errorf("the completer: %w", err)
		}
	}
	return nil
}

// Inspect says what phase_requests holds for the key, as committed: each
// phase commits at once, so its recovery point shows while the request
// works.
func (s *Store) Inspect(ctx context.Context, sc lab.Scope) (lab.KeyInspection, error) {
	in := lab.KeyInspection{Where: "PostgreSQL table phase_requests", State: lab.KeyAbsent, Shared: true}
	now := s.now()
	r, err := s.read(ctx, sc, now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		in.Facts = []string{"no row: the next attempt claims the key (phase 1)"}
		return in, nil
	case err != nil:
		return in, err
	}
	in.State = lab.KeyInFlight
	in.Facts = append(in.Facts, "recovery point "+r.point, fmt.Sprintf("token %d", r.token))
	switch {
	case r.point == finished:
		in.State = lab.KeyCompleted
		in.Facts = append(in.Facts, "finished by the "+r.completedBy)
	case r.locked:
		in.Facts = append(in.Facts, "locked for "+lab.Span(r.lockedUntil.Sub(now))+" more: a twin gets 409")
	default:
		in.Facts = append(in.Facts, fmt.Sprintf("lock ended %s ago: the next attempt resumes from %s, or the completer %s after the lock",
			lab.Span(now.Sub(r.lockedUntil)), r.point, lab.Span(s.completeAfter)))
	}
	if r.point != started {
		in.Facts = append(in.Facts, "its charge is "+r.chargeID)
	}
	in.Facts = append(in.Facts, "fingerprint "+lab.ShortFingerprint(r.fingerprint))
	return in, nil
}

var (
	_ lab.KeyInspector = (*Store)(nil)
	_ lab.TimeMover    = (*Store)(nil)
	_ lab.Completer    = (*Store)(nil)
)
