package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// acquire takes a connection within the namespace's budget. The whole wait
// of an attempt is bounded by s.wait: first for the budget and a
// connection, then, with what is left (lockWait from start), for a twin's
// row lock.
func (s *Store) acquire(ctx context.Context, ns lab.Namespace) (conn *pgdb.Conn, start time.Time, err error) {
	start = time.Now()
	acquireCtx, cancel := lab.WaitBound(ctx, s.wait)
	defer cancel()
	conn, err = s.pool.Acquire(acquireCtx, ns, pgdb.Short)
	if err != nil {
		if ctx.Err() != nil {
			return nil, start, ctx.Err()
		}
		return nil, start, fmt.Errorf("%w (waited %s)", err, s.wait)
	}
	return conn, start, nil
}

// lockWait is what is left of the bounded wait since start.
func (s *Store) lockWait(ctx context.Context, start time.Time) time.Duration {
	return max(lab.BoundedWait(ctx, s.wait)-time.Since(start), time.Millisecond)
}

func isLockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03" // lock_not_available
}

// balanceLocked is the error of a charge whose account row, hot with other
// charges, stayed locked past the bounded wait: the transaction rolls back.
func (s *Store) balanceLocked() error {
	return fmt.Errorf("%w: the account's balance stayed locked for %s", lab.ErrStoreUnavailable, s.wait)
}
