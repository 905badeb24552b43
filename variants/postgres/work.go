package postgres

import (
	"context"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// work is the attempt's own work between the claim and the charge, where
// the lab injects its faults: a crash before anything is charged, or slow
// work through which the transaction stays open.
func (s *Store) work(ctx context.Context, conn *pgdb.Conn, a lab.Attempt, start time.Time) error {
	lab.Mark(ctx, lab.PhaseClaim)
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		return lab.ErrCrash
	}
	if a.Faults.Pauses() {
		// A connection held across slow work, of which a namespace, and the
		// replica, may hold only a few. Without a slot it rolls back, and a
		// retry is safe.
		hold, cancel := context.WithTimeout(ctx, s.lockWait(ctx, start))
		err := conn.HoldAcrossWork(hold)
		cancel()
		if err != nil {
			return err
		}
	}
	return a.Faults.Pause(ctx)
}
