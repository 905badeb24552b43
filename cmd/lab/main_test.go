package main

import (
	"io"
	"os"
	"testing"

	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
)

func TestMain(m *testing.M) { os.Exit(labtest.WithServices(m).Run()) }

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
