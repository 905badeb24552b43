package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// Every lab, server, attacker and attendee a test starts (lab bench's and
// lab load's among them) must stop with it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(labtest.WithServices(m), goleak.Cleanup(func(code int) {
		_ = os.RemoveAll(binDir)
		os.Exit(code)
	}))
}

// binDir holds the binary builtLab builds, removed when the tests end.
var binDir = filepath.Join(os.TempDir(), fmt.Sprintf("lab-test-bin-%d", os.Getpid()))

// builtLab builds the lab binary the first time it is asked for.
var builtLab = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(binDir, "lab")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
})

// startLab runs the lab the command builds (NewMain: the defaults and every
// built-in variant) on a free loopback port, with no embedded services,
// changed by opts, until the test ends.
func startLab(tb testing.TB, opts ...func(*app.Config)) *app.App {
	tb.Helper()
	cfg := NewMain(io.Discard).Config
	cfg.Addr = "127.0.0.1:0"
	cfg.EmbedPostgres, cfg.EmbedRedis = false, false
	for _, o := range opts {
		o(&cfg)
	}
	return labtest.Start(tb, cfg)
}
