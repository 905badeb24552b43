package lease

import (
	"context"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// heartbeat renews the claim's lease (renew, in store.go) every third of it
// while the work runs, for as long as the claim is still this worker's; the
// returned func stops it and waits until it stopped. A renewal that finds
// the token gone stops: the write will be fenced.
func (s *Store) heartbeat(ctx context.Context, sc lab.Scope, cl claim, lease time.Duration) (stop func()) {
	s.signals.renewing.Send(cl.token)
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
			ours, err := s.renew(ctx, sc, cl, lease)
			switch {
			case err != nil:
				s.log.WarnContext(ctx, "renewing a lease failed; trying again", "key", sc.Key, "err", err)
			case !ours:
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
