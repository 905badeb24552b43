package matrix_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/idempotency-lab/lab/lab/labtest"
)

// Every lab, replica, relay, sweeper and pool a test starts must stop on Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(labtest.WithServices(m)) }
