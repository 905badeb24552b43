// One-statement replay: a retry of a completed key is answered by one
// SELECT, outside any transaction, instead of the step-by-step path's
// BEGIN, SET LOCAL, INSERT, SELECT and ROLLBACK.
//
// What it buys, in lab bench's replay phase (postgres, 1 replica, 16
// connections, 3 s phases): medians of 7 runs, each build in turn, on a
// shared 2-core machine whose runs differ by 15-40 %:
//
//	plain path                          840 replays/s   p50 12.4 ms
//	this optimisation alone           1,775 replays/s   p50  2.7 ms   +111 %
//	pipelined commit alone            1,087 replays/s   p50  7.7 ms
//	both (the default)                1,840 replays/s   p50  4.0 ms   +69 % over the pipelined commit alone
//
// The statement that misses costs a first charge nothing measurable (fresh
// charges on 1,000 accounts: 523/s with it alone, 490/s plain). The first
// and last rows come from
//
//	go run ./cmd/lab bench -stores postgres -replicas 1 -duration 3s -ceilings=false -attempt-runs 0 -plain-paths on
//
// and the same with -plain-paths off; the rows of one optimisation alone
// from a build with the other one turned off.
//
// TestFastReplayNeverAnswersWhatTheTransactionWouldNot
// (fastpath_internal_test.go) holds it to the transaction's answers, row
// kind by row kind; TestPlainAndOptimisedAgree (plain_test.go) and
// TestConformancePlain run the same scenarios on both paths.

package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// replayFast answers a retry of a completed, unexpired key with the same
// fingerprint from one statement: the most common request of an idempotent
// API in one round trip. Anything else (absent, in flight, expired, another
// fingerprint, or an error) is left to the transaction, which decides it
// as the plain path does. It holds a connection for one statement and never
// waits on a lock; only a pool that stays exhausted for the bounded wait is
// an error here.
func (s *Store) replayFast(ctx context.Context, a lab.Attempt) (lab.Outcome, bool, error) {
	acquireCtx, cancel := context.WithTimeout(ctx, s.wait)
	defer cancel()
	conn, err := s.pool.Acquire(acquireCtx, a.Scope.Namespace, pgdb.Short)
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, lab.ErrStoreUnavailable) {
			return lab.Outcome{}, false, fmt.Errorf("%w (waited %s)", err, s.wait)
		}
		return lab.Outcome{}, false, nil // the transaction tries again, and says what failed
	}
	defer conn.Release()
	return s.replayOn(ctx, conn.Conn, a)
}

// replayOn is replayFast's statement on a connection already held: the
// pipelined path asks it again when it queued behind the namespace's other
// attempts, often its own twins, one of which may have completed meanwhile.
func (s *Store) replayOn(ctx context.Context, conn *pgxpool.Conn, a lab.Attempt) (lab.Outcome, bool, error) {
	var status int
	var body []byte
	err := conn.QueryRow(ctx, s.q(`
		SELECT response_status, response_body FROM idempotency_requests
		WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3
		  AND state = 'completed' AND request_fingerprint = $4 AND expires_at > $5 AND response_status IS NOT NULL`),
		a.Scope.Tenant, a.Scope.Endpoint, a.Scope.Key, a.Fingerprint, s.now()).Scan(&status, &body)
	if err != nil {
		return lab.Outcome{}, false, nil
	}
	return lab.Outcome{Response: lab.Response{Status: status, Body: body}, Replayed: true}, true, nil
}
