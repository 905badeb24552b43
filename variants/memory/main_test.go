package memory_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/idempotency-lab/lab/lab/labtest"
)

// The conformance suite runs memory beside the real services' backends.
func TestMain(m *testing.M) { goleak.VerifyTestMain(labtest.WithServices(m)) }
