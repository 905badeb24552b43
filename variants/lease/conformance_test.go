package lease_test

import (
	"testing"

	"github.com/idempotency-lab/lab/variants/conformance"
	"github.com/idempotency-lab/lab/variants/lease"
)

func TestConformance(t *testing.T) { conformance.Exercise(t, lease.Variant()) }
