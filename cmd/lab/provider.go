package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/httpserve"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/prune"
)

// runProvider serves the simulated payment provider alone until ctx ends:
// the service the lab's relay delivers to when LAB_PROVIDER_URL points at
// it, calling the lab back with signed webhooks.
func runProvider(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab provider", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", env("LAB_PROVIDER_ADDR", "127.0.0.1:8617"), "listen address (env LAB_PROVIDER_ADDR)")
	webhookURL := fs.String("webhook-url", env("LAB_WEBHOOK_URL", ""),
		"where webhooks go, e.g. http://127.0.0.1:8616/webhooks/provider; empty sends none (env LAB_WEBHOOK_URL)")
	secret := fs.String("webhook-secret", env("LAB_WEBHOOK_SECRET", ""), "secret the webhooks are signed with; the lab's -webhook-secret (env LAB_WEBHOOK_SECRET)")
	apiKey := fs.String("api-key", env("LAB_PROVIDER_API_KEY", ""),
		"API key every call must carry as Authorization: Bearer; the lab's -provider-api-key (env LAB_PROVIDER_API_KEY)")
	dbURL := fs.String("database-url", env("DATABASE_URL", ""), "PostgreSQL for the provider's records; empty keeps them in memory (env DATABASE_URL)")
	schema := fs.String("pg-schema", env("LAB_PG_SCHEMA", "idempotency_lab"), "PostgreSQL schema of the records (env LAB_PG_SCHEMA)")
	level := fs.String("log-level", env("LAB_LOG_LEVEL", "info"), "debug, info, warn or error (env LAB_LOG_LEVEL)")
	// The lab's own servers' timeouts, and its provider's webhook window,
	// under the same names.
	d := app.DefaultConfig()
	if err := declare(fs, append(timeoutSettings(&d),
		setting{"webhook-window", "LAB_WEBHOOK_WINDOW", "how long an unacknowledged webhook is retried before it is dead (env LAB_WEBHOOK_WINDOW)", (*duration)(&d.WebhookWindow)},
		setting{"prune-after", "LAB_PRUNE_AFTER", "receipts and delivered webhooks are pruned once this old (never the captures); at least -webhook-window plus the 1m webhook lease (env LAB_PRUNE_AFTER)", (*duration)(&d.PruneAfter)},
		setting{"prune-interval", "LAB_PRUNE_INTERVAL", "how often the pruner deletes what outlived -prune-after, in batches of 1,000 (env LAB_PRUNE_INTERVAL)", (*duration)(&d.PruneInterval)},
	), os.LookupEnv); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	lease := provider.DefaultConfig().WebhookLease
	if least := d.WebhookWindow + lease; d.PruneAfter < least || d.PruneInterval <= 0 {
		return fmt.Errorf("-prune-after is %s and -prune-interval %s: the retention must be at least the webhook window (%s) and its lease (%s), %s, "+
			"and the interval positive", d.PruneAfter, d.PruneInterval, d.WebhookWindow, lease, least)
	}
	log, err := newLogger(stderr, *level)
	if err != nil {
		return err
	}
	cfg := provider.DefaultConfig()
	cfg.Logger, cfg.APIKey, cfg.WebhookURL, cfg.Secret, cfg.Records = log, *apiKey, *webhookURL, []byte(*secret), provider.NewMemory()
	cfg.WebhookWindow = d.WebhookWindow
	if err := provider.CheckAPIKey(cfg.APIKey); err != nil {
		return fmt.Errorf("%w (set -api-key or LAB_PROVIDER_API_KEY, and the lab's -provider-api-key to the same)", err)
	}
	where := "memory"
	if *dbURL != "" {
		pool, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: *dbURL, Schema: *schema, Size: 10, AppName: "idempotency-lab-provider", Migrate: true})
		if err != nil {
			return err
		}
		defer pool.Close()
		// The webhooks' claims and outcomes commit without waiting for
		// the WAL flush, on a pool of their own: losing one resends a
		// webhook, which the lab deduplicates by event id.
		acks, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: *dbURL, Schema: *schema, Size: 4, AppName: "idempotency-lab-provider", AsyncCommit: true})
		if err != nil {
			return err
		}
		defer acks.Close()
		cfg.Records, where = pgdb.NewProviderRecords(pool).AckingThrough(acks), "postgres schema "+*schema
	}
	p, err := provider.New(cfg)
	if err != nil {
		return fmt.Errorf("%w (set -webhook-secret or LAB_WEBHOOK_SECRET with -webhook-url)", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", *addr)
	if err != nil {
		return fmt.Errorf("error listening on %s: %w", *addr, err)
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	p.Register(e.Group("/provider"))
	srv := httpserve.New(e, d.Timeouts())
	work, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.Run(work) })
	if pruner, ok := cfg.Records.(provider.Pruner); ok {
		cutoff := func() time.Time { return time.Now().Add(-d.PruneAfter) }
		wg.Go(func() { prune.Run(work, d.PruneInterval, cutoff, provider.PruneTargets(pruner), log) })
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(httpserve.Listener(ln)) }()
	log.Info("provider listening", "url", "http://"+ln.Addr().String()+"/provider", "records", where, "webhooks", *webhookURL)
	select {
	case <-ctx.Done():
	case err = <-served:
	}
	stop() // withheld answers are let go; undelivered webhooks stay in the records
	wg.Wait()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil && err == nil {
		err = serr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
