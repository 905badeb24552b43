package labtest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails when a service WithServices started leaves a goroutine
// behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
