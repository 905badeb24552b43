package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab/api"
	"github.com/idempotency-lab/lab/lab/cost"
	"github.com/idempotency-lab/lab/lab/delivery"
	"github.com/idempotency-lab/lab/lab/httpserve"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/provider"
)

// openProvider connects the lab to its payment provider: the one at
// ProviderURL, or one of its own on ProviderAddr (its records beside the
// books, in PostgreSQL when configured), whose webhooks go to webhookURL.
// The provider's background work runs on bgCtx.
func (a *App) openProvider(ctx, bgCtx context.Context, webhookURL string) error {
	a.secret = []byte(a.cfg.WebhookSecret)
	key := a.cfg.ProviderAPIKey
	base := a.cfg.ProviderURL
	if base == "" {
		if len(a.secret) == 0 {
			a.secret = make([]byte, 32)
			_, _ = rand.Read(a.secret) // never fails (crypto/rand)
		}
		if key == "" {
			key = rand.Text() // only this process holds it: nobody else calls its provider
		}
		own, err := a.startProvider(ctx, bgCtx, webhookURL, key)
		if err != nil {
			return err
		}
		base = own
	}
	// The deliveries time out on their own: a withheld answer must not hold
	// a relay worker (or a direct send) longer than this. The lab's own
	// reads and settings of its provider (stats, captures, faults) are
	// bounded by their caller instead: a provider slowed by a loaded
	// machine is slow, not gone. A connection is kept alive for each
	// delivery the relay may have in flight.
	transport := a.meter.Transport(provider.NewTransport(a.cfg.Relay.MaxWorkers * a.cfg.Relay.Concurrency))
	hc := &http.Client{Timeout: a.cfg.ProviderTimeout, Transport: transport}
	a.addCloser(hc.CloseIdleConnections)
	a.providerClient = provider.NewClient(base+"/provider", key, hc)
	a.providerAdmin = provider.NewClient(base+"/provider", key, &http.Client{Transport: transport})
	a.effects = delivery.New(a.providerClient, a.books)
	// The URL only: /ready is public, and neither the key nor a password
	// in the URL is ever shown.
	shown := base
	if u, err := url.Parse(base); err == nil {
		u.User = nil
		shown = u.String()
	}
	a.checks = append(a.checks, api.Check{Name: "provider", Describe: "payment provider at " + shown,
		Ping: a.providerClient.Health})
	return nil
}

// ownRecords are the records of the lab's own provider: the lab reads its
// queue and prunes them.
type ownRecords interface {
	provider.Records
	provider.Pruner
}

// openProviderRecords keeps the own provider's records in the lab's
// database, on pools of their own as another service's would be: what the
// lab's pools count is the lab's work alone. Captures and receipts commit
// durably; the webhooks' claims and outcomes asynchronously (see
// pgdb.ProviderRecords.AckingThrough).
func (a *App) openProviderRecords(ctx context.Context) (*pgdb.ProviderRecords, error) {
	open := func(name string, size int32, async bool) (*pgxpool.Pool, error) {
		pool, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: a.cfg.DatabaseURL, Schema: a.cfg.PGSchema, Size: size, AppName: a.instance,
			AsyncCommit: async, Tracer: a.meter.SQL(cost.Provider, name, !async)})
		if err != nil {
			return nil, fmt.Errorf("error connecting the provider's %s: %w", name, err)
		}
		a.mu.Lock()
		a.pools = append(a.pools, pool)
		a.mu.Unlock()
		a.addCloser(pool.Close)
		return pool, nil
	}
	records, err := open("records", 10, false)
	if err != nil {
		return nil, err
	}
	acks, err := open("acks", 8, true)
	if err != nil {
		return nil, err
	}
	return pgdb.NewProviderRecords(records).AckingThrough(acks), nil
}

// startProvider serves the lab's own provider, which asks for key, and
// returns its base URL.
func (a *App) startProvider(ctx, bgCtx context.Context, webhookURL, key string) (string, error) {
	var records ownRecords = provider.NewMemory()
	if a.pool != nil {
		pg, err := a.openProviderRecords(ctx)
		if err != nil {
			return "", err
		}
		records = pg // every replica of a cluster sees one provider
	}
	a.ownProvider = records
	pcfg := provider.DefaultConfig()
	pcfg.Records, pcfg.APIKey, pcfg.Secret, pcfg.WebhookURL, pcfg.Clock = records, key, a.secret, webhookURL, a.cfg.Clock
	pcfg.Logger = a.cfg.Logger.With("service", "provider")
	pcfg.WebhookWindow, pcfg.WebhookWorkers = a.cfg.WebhookWindow, a.cfg.WebhookSenders
	p, err := provider.New(pcfg)
	if err != nil {
		return "", fmt.Errorf("error configuring the provider: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", a.cfg.ProviderAddr)
	if err != nil {
		return "", fmt.Errorf("error listening for the provider on %s: %w", a.cfg.ProviderAddr, err)
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	p.Register(e.Group("/provider"))
	srv := httpserve.New(e, a.cfg.Timeouts())
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(httpserve.Listener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.cfg.Logger.Error("the provider stopped serving", "err", err)
		}
	}()
	a.addCloser(func() {
		// Withheld answers end with the provider's Run; the rest finish here.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
		<-served
	})
	a.bg.Go(func() { p.Run(bgCtx) })
	url := selfURL(ln)
	a.cfg.Logger.Info("provider listening", "url", url, "webhooks", webhookURL)
	return url, nil
}
