package rediscache_test

import (
	"testing"

	"github.com/idempotency-lab/lab/variants/conformance"
	"github.com/idempotency-lab/lab/variants/rediscache"
)

func TestConformance(t *testing.T) { conformance.Exercise(t, rediscache.Variant()) }
