package redis

// Twins in this process look again as soon as the claim they wait on
// settles here, instead of at their next poll.
//
// 64 concurrent attempts of one key, lab bench, median wall of 5 runs each
// in 4 benches alternated with the plain path (which polls), onetrip.go
// included: 66 ms against 108 ms. Reproduce:
//
//	go run ./cmd/lab bench -stores redis -replicas 1 -duration 3s \
//	    -ceilings=false -attempt-runs 5 -plain-paths off   # then on, alternating
//
// TestConformancePlain (conformance_test.go) and TestPlainPathAnswersAlike
// (plain_test.go) hold the plain path, which polls, to the same answers.

import (
	"context"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// pause waits before a twin looks at the key again: for d, or less when a
// twin in this process settles it first.
func (s *Store) pause(ctx context.Context, k string, d time.Duration) error {
	if s.plain {
		return lab.Sleep(ctx, d)
	}
	return s.wake.Wait(ctx, k, d)
}
