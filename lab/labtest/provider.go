package labtest

import (
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab/provider"
)

// Provider serves a payment provider over real HTTP for the test, its
// records in memory, and returns a client of it.
func Provider(tb testing.TB) *provider.Client {
	tb.Helper()
	cfg := provider.DefaultConfig()
	cfg.Records, cfg.Logger = provider.NewMemory(), slog.New(slog.DiscardHandler)
	p, err := provider.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	e := echo.New()
	p.Register(e.Group("/provider"))
	srv := httptest.NewServer(e)
	tb.Cleanup(srv.Close)
	return provider.NewClient(srv.URL+"/provider", srv.Client())
}
