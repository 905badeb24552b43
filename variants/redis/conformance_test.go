package redis_test

import (
	"testing"

	"github.com/idempotency-lab/lab/variants/conformance"
	"github.com/idempotency-lab/lab/variants/redis"
)

func TestConformance(t *testing.T) { conformance.Exercise(t, redis.Variant()) }
