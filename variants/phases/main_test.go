package phases_test

import (
	"os"
	"testing"

	"github.com/idempotency-lab/lab/lab/labtest"
)

func TestMain(m *testing.M) { os.Exit(labtest.WithServices(m).Run()) }
