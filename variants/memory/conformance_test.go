package memory_test

import (
	"testing"

	"github.com/idempotency-lab/lab/variants/conformance"
	"github.com/idempotency-lab/lab/variants/memory"
)

func TestConformance(t *testing.T) { conformance.Exercise(t, memory.Variant()) }
