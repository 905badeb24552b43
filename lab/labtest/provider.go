package labtest

import (
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab/provider"
)

// ProviderKey is the API key of the providers StartProvider serves.
const ProviderKey = "labtest-provider-key"

// ProviderServer is a payment provider served over real HTTP for a test.
type ProviderServer struct {
	URL      string // the provider's base, for a client of the test's own
	Client   *provider.Client
	Records  *provider.Memory
	Provider *provider.Provider
}

// StartProvider serves a payment provider over real HTTP for the test, its
// records in memory.
func StartProvider(tb testing.TB) ProviderServer {
	tb.Helper()
	records := provider.NewMemory()
	cfg := provider.DefaultConfig()
	cfg.Records, cfg.APIKey, cfg.Logger = records, ProviderKey, slog.New(slog.DiscardHandler)
	p, err := provider.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	e := echo.New()
	p.Register(e.Group("/provider"))
	srv := httptest.NewServer(e)
	tb.Cleanup(srv.Close)
	return ProviderServer{URL: srv.URL + "/provider", Client: provider.NewClient(srv.URL+"/provider", ProviderKey, srv.Client()), Records: records, Provider: p}
}

// Provider serves a payment provider for the test and returns a client of it.
func Provider(tb testing.TB) *provider.Client { return StartProvider(tb).Client }
