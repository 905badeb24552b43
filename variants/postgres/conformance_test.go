package postgres_test

import (
	"testing"

	"github.com/idempotency-lab/lab/variants/conformance"
	"github.com/idempotency-lab/lab/variants/postgres"
)

func TestConformance(t *testing.T) { conformance.Exercise(t, postgres.Variant()) }
