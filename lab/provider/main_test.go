package provider_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/idempotency-lab/lab/lab/labtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(labtest.WithServices(m)) }
