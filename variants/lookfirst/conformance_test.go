package lookfirst_test

import (
	"testing"

	"github.com/idempotency-lab/lab/variants/conformance"
	"github.com/idempotency-lab/lab/variants/lookfirst"
)

func TestConformance(t *testing.T) { conformance.Exercise(t, lookfirst.Variant()) }
