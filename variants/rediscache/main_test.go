package rediscache_test

import (
	"os"
	"testing"

	"github.com/idempotency-lab/lab/lab/labtest"
)

// The conformance suite needs PostgreSQL and Redis: the machine's, or ones
// this test binary starts.
func TestMain(m *testing.M) { os.Exit(labtest.WithServices(m).Run()) }
