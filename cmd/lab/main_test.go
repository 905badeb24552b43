package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/app"
)

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
	a, err := app.Start(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("starting lab: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil {
			tb.Errorf("closing lab: %v", err)
		}
	})
	return a
}
