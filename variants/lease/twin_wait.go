package lease

import (
	"context"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// claimOrWait is phase one, or a twin's bounded wait for the key's owner:
// the claim won (its token is 0 when none was), or the answer to give
// instead: a replay, 202 pending once the bound runs out, an error.
// lab.WaitBound bounds the wait, so a stepped run's "wait" move ends it as
// the bound's end does.
func (s *Store) claimOrWait(ctx context.Context, a lab.Attempt, lease, retention time.Duration) (claim, lab.Outcome, error) {
	bound, endBound := lab.WaitBound(ctx, s.wait)
	defer endBound()
	backoff := 5 * time.Millisecond // a twin's work takes milliseconds: look again soon, then less often
	for {
		won, r, err := s.claim(ctx, a, lease, retention)
		switch {
		case err != nil:
			return claim{}, lab.Outcome{}, err
		case won != nil:
			return *won, lab.Outcome{}, nil
		case r.fingerprint != a.Fingerprint:
			return claim{}, lab.Outcome{}, lab.ErrKeyReused
		case r.state == lab.KeyCompleted:
			lab.Mark(ctx, lab.PhaseReplay)
			return claim{}, lab.Outcome{Response: lab.Response{Status: *r.status, Body: r.body}, Replayed: true}, nil
		case bound.Err() != nil && ctx.Err() == nil: // still working under a live lease: say where to look
			pending := &lab.Operation{Key: a.Scope.Key, State: lab.KeyInFlight, Token: r.token, LeaseExpires: r.leaseExpires.UTC()}
			return claim{}, lab.Outcome{Pending: pending}, nil
		}
		if err := lab.Sleep(bound, backoff); err != nil && ctx.Err() != nil {
			return claim{}, lab.Outcome{}, ctx.Err() // the caller left
		}
		backoff = min(2*backoff, 20*time.Millisecond)
	}
}
