package phases_test

import (
	"testing"

	"github.com/idempotency-lab/lab/variants/conformance"
	"github.com/idempotency-lab/lab/variants/phases"
)

func TestConformance(t *testing.T) { conformance.Exercise(t, phases.Variant()) }
