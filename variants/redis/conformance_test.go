package redis_test

import (
	"context"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants/conformance"
	"github.com/idempotency-lab/lab/variants/redis"
)

func TestConformance(t *testing.T) { conformance.Exercise(t, redis.Variant()) }

// TestConformancePlain holds the plain path (-plain-paths on) to the same
// scenarios and state machine: the same answers, the same ledger.
func TestConformancePlain(t *testing.T) { conformance.Exercise(t, plainPath(redis.Variant())) }

// plainPath is v opened as -plain-paths on opens it.
func plainPath(v variant.Variant) variant.Variant {
	open := v.Open
	v.Open = func(ctx context.Context, d variant.Deps) (lab.Store, error) {
		d.Plain = true
		return open(ctx, d)
	}
	return v
}
