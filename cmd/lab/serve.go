package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab/app"
)

// Main is the serve command: parse configuration, run, close.
type Main struct {
	Config   app.Config
	LogLevel string
	stderr   io.Writer
}

// NewMain returns a Main writing logs to stderr.
func NewMain(stderr io.Writer) *Main { return &Main{stderr: stderr} }

// env returns the environment variable or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

// ParseFlags reads flags, with environment variables as their defaults.
func (m *Main) ParseFlags(args []string) error {
	fs, finish := m.flags("lab serve")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return finish()
}

// flags declares the lab's configuration on a new flag set; finish checks
// and converts the values after parsing.
func (m *Main) flags(name string) (fs *flag.FlagSet, finish func() error) {
	fs = flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(m.stderr)
	c := &m.Config
	fs.StringVar(&c.Addr, "addr", env("LAB_ADDR", "127.0.0.1:8616"), "listen address (env LAB_ADDR)")
	fs.StringVar(&c.BasePath, "base-path", env("LAB_BASE_PATH", ""), "route prefix when behind a hub, e.g. /16 (env LAB_BASE_PATH)")
	tenants := fs.String("tenants", env("LAB_TENANTS", "demo-token-acme:acme,demo-token-globex:globex"), "bearer tokens and their tenants, token:tenant,... (env LAB_TENANTS)")
	fs.StringVar(&c.AdminToken, "admin-token", env("LAB_ADMIN_TOKEN", ""), "token /reset-lab requires; empty means none (env LAB_ADMIN_TOKEN)")
	faults := fs.String("faults", env("LAB_FAULTS", "on"), "fault injection, on or off (env LAB_FAULTS)")
	fs.StringVar(&c.DefaultStore, "default-store", env("LAB_DEFAULT_STORE", "memory"), "store of POST /charges without ?store= (env LAB_DEFAULT_STORE)")
	window := fs.String("dedupe-window", env("LAB_DEDUPE_WINDOW", "24h"), "how long a completed key is kept (env LAB_DEDUPE_WINDOW)")
	wait := fs.String("inflight-wait", env("LAB_INFLIGHT_WAIT", "2s"), "bounded wait for an in-flight request with the same key before 409 (env LAB_INFLIGHT_WAIT)")
	ttl := fs.String("claim-ttl", env("LAB_CLAIM_TTL", "30s"), "redis claim TTL (env LAB_CLAIM_TTL)")
	sweep := fs.String("sweep-interval", env("LAB_SWEEP_INTERVAL", "1m"), "how often expired keys are swept (env LAB_SWEEP_INTERVAL)")
	fs.IntVar(&c.MaxReplicas, "max-replicas", 8, "in-process replicas a run may use, 1..8")
	peers := fs.String("peers", env("LAB_PEERS", ""), "base URLs of peer lab processes, comma-separated (env LAB_PEERS)")
	fs.StringVar(&c.Replica, "replica", env("LAB_REPLICA", "r1"), "name of this replica (env LAB_REPLICA)")
	fs.StringVar(&c.DatabaseURL, "database-url", env("DATABASE_URL", ""), "PostgreSQL URL; holds the ledger, the outbox and the postgres store (env DATABASE_URL)")
	fs.StringVar(&c.PGSchema, "pg-schema", env("LAB_PG_SCHEMA", "idempotency_lab"), "the lab's own PostgreSQL schema (env LAB_PG_SCHEMA)")
	pool := fs.Int("pg-pool-size", 20, "PostgreSQL connections per replica")
	fs.BoolVar(&c.EmbedPostgres, "embedded-postgres", env("LAB_EMBEDDED_POSTGRES", "on") == "on", "without DATABASE_URL, start a throwaway PostgreSQL cluster when the server binaries are installed; on or off (env LAB_EMBEDDED_POSTGRES)")
	fs.StringVar(&c.RedisURL, "redis-url", env("REDIS_URL", ""), "Redis URL for the redis store (env REDIS_URL)")
	fs.StringVar(&c.RedisPrefix, "redis-prefix", env("LAB_REDIS_PREFIX", "idempotency-lab:"), "prefix of every Redis key the lab writes (env LAB_REDIS_PREFIX)")
	fs.BoolVar(&c.EmbedRedis, "embedded-redis", env("LAB_EMBEDDED_REDIS", "on") == "on", "without REDIS_URL, start an embedded Redis (miniredis); on or off (env LAB_EMBEDDED_REDIS)")
	fs.StringVar(&m.LogLevel, "log-level", env("LAB_LOG_LEVEL", "info"), "debug, info, warn or error (env LAB_LOG_LEVEL)")
	return fs, func() error { return m.finish(*tenants, *faults, *window, *wait, *ttl, *sweep, *peers, *pool) }
}

func (m *Main) finish(tenants, faults, window, wait, ttl, sweep, peers string, pool int) error {
	c := &m.Config
	var err error
	if c.Tenants, err = parseTenants(tenants); err != nil {
		return err
	}
	switch faults {
	case "on", "true", "1":
		c.FaultsEnabled = true
	case "off", "false", "0":
	default:
		return fmt.Errorf("-faults must be on or off (got %q)", faults)
	}
	for _, d := range []struct {
		name string
		raw  string
		dst  *time.Duration
	}{{"dedupe-window", window, &c.Window}, {"inflight-wait", wait, &c.InFlightWait}, {"claim-ttl", ttl, &c.ClaimTTL}, {"sweep-interval", sweep, &c.SweepInterval}} {
		v, err := time.ParseDuration(d.raw)
		if err != nil || v <= 0 {
			return fmt.Errorf("-%s must be a positive duration such as 2s (got %q)", d.name, d.raw)
		}
		*d.dst = v
	}
	if pool < 1 || pool > 500 {
		return fmt.Errorf("-pg-pool-size must be in 1..500 (got %d)", pool)
	}
	c.PGPoolSize = int32(pool)
	if c.MaxReplicas < 1 || c.MaxReplicas > 8 {
		return fmt.Errorf("-max-replicas must be in 1..8 (got %d)", c.MaxReplicas)
	}
	for p := range strings.SplitSeq(peers, ",") {
		if p = strings.TrimSuffix(strings.TrimSpace(p), "/"); p != "" {
			c.Peers = append(c.Peers, p)
		}
	}
	return nil
}

func parseTenants(s string) (map[string]string, error) {
	out := map[string]string{}
	for pair := range strings.SplitSeq(s, ",") {
		token, tenant, ok := strings.Cut(strings.TrimSpace(pair), ":")
		if !ok || token == "" || tenant == "" {
			return nil, fmt.Errorf("-tenants must be token:tenant pairs separated by commas (got %q)", pair)
		}
		out[token] = tenant
	}
	return out, nil
}

// Run serves until ctx is cancelled, then shuts down gracefully.
func (m *Main) Run(ctx context.Context) error {
	log, err := newLogger(m.stderr, m.LogLevel)
	if err != nil {
		return err
	}
	m.Config.Logger = log
	a, err := app.Start(ctx, m.Config)
	if err != nil {
		return err
	}
	log.Info("lab ready", "url", a.URL())
	select {
	case <-ctx.Done():
	case err = <-a.Served():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if cerr := a.Close(sctx); cerr != nil && err == nil {
		err = cerr
	}
	return err
}
