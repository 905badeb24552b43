package cached_test

import (
	"testing"

	"github.com/idempotency-lab/lab/variants/cached"
	"github.com/idempotency-lab/lab/variants/conformance"
)

func TestConformance(t *testing.T) { conformance.Exercise(t, cached.Variant()) }
