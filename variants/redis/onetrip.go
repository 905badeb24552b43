package redis

// Claim or read in one round trip: a replay costs one command, not two.
//
// Replays per second, lab bench with DATABASE_URL and REDIS_URL set, median
// of 3 runs alternated with the plain path on a shared 2-core machine: 1,562
// against 1,116 (+40 %). In the store alone (go test -bench Replay
// ./variants/redis/, real Redis) a replay takes 52 µs against 90 µs.
// Reproduce:
//
//	go run ./cmd/lab bench -stores redis -replicas 1 -duration 3s \
//	    -ceilings=false -attempt-runs 0 -plain-paths off   # then on, alternating
//
// TestPlainPathAnswersAlike (plain_test.go) and TestConformancePlain
// (conformance_test.go) hold the plain path (SET NX, then GET) to the same
// answers and ledger.

import (
	"context"
	"errors"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// claimOrReadOneTrip is SET k claim NX PX ttl GET: it sets the claim when
// the key is absent (answering nil) and otherwise changes nothing and
// answers what the key holds (Redis 7.0 or later).
func (s *Store) claimOrReadOneTrip(ctx context.Context, k, claim string, ttl time.Duration) (held string, won bool, err error) {
	held, err = s.client.SetArgs(ctx, k, claim, goredis.SetArgs{Mode: "NX", TTL: ttl, Get: true}).Result()
	if errors.Is(err, goredis.Nil) {
		return "", true, nil
	}
	return held, false, err
}
