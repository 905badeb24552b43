// Package app assembles the lab: the books (PostgreSQL or memory), the
// stores of each replica, the HTTP servers, the outbox relay and the sweeper.
package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/relay"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/postgres/embedded"
	"github.com/idempotency-lab/lab/variants/redis"
	"github.com/idempotency-lab/lab/variants/unsafe"
)

// Config configures the lab. Every field's default is set by Defaults.
type Config struct {
	Addr          string            // listen address; default 127.0.0.1:8616
	BasePath      string            // route prefix behind a hub, e.g. /16
	Tenants       map[string]string // bearer token -> tenant; default two demo tenants
	AdminToken    string            // required by /reset-lab when set
	FaultsEnabled bool              // fault injection (on by default in the lab)
	DefaultStore  string            // store of POST /charges without ?store=; default memory
	Window        time.Duration     // dedupe window (key retention); default 24h
	InFlightWait  time.Duration     // bounded wait for an in-flight twin; default 2s
	ClaimTTL      time.Duration     // redis claim TTL; default 30s
	SweepInterval time.Duration     // expired-key sweeper period; default 1m
	MaxReplicas   int               // in-process replicas a run may use; default 8
	Peers         []string          // base URLs of peer processes (cluster mode)
	Replica       string            // this replica's name; default r1
	DatabaseURL   string            // PostgreSQL; "" means none (or the embedded cluster)
	PGSchema      string            // the lab's schema; default idempotency_lab
	PGPoolSize    int32             // connections per replica pool; default 20
	EmbedPostgres bool              // without DatabaseURL, start a throwaway cluster when PostgreSQL is installed
	RedisURL      string            // Redis; "" means none (or the embedded one)
	RedisPrefix   string            // namespace of the lab's Redis keys; default idempotency-lab:
	EmbedRedis    bool              // without RedisURL, start an embedded Redis (miniredis)
	Logger        *slog.Logger
}

// DemoTenants are the two tenants the README documents.
func DemoTenants() map[string]string {
	return map[string]string{"demo-token-acme": "acme", "demo-token-globex": "globex"}
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.Addr == "" {
		c.Addr = "127.0.0.1:8616"
	}
	if len(c.Tenants) == 0 {
		c.Tenants = DemoTenants()
	}
	if c.DefaultStore == "" {
		c.DefaultStore = lab.StoreMemory
	}
	if c.Window <= 0 {
		c.Window = 24 * time.Hour
	}
	if c.InFlightWait <= 0 {
		c.InFlightWait = 2 * time.Second
	}
	if c.ClaimTTL <= 0 {
		c.ClaimTTL = 30 * time.Second
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = time.Minute
	}
	if c.MaxReplicas <= 0 {
		c.MaxReplicas = 8
	}
	if c.Replica == "" {
		c.Replica = "r1"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// App is a running lab.
type App struct {
	cfg      Config
	books    lab.Books
	client   *http.Client
	runner   *experiment.Runner
	instance string        // names this lab's database sessions
	pool     *pgxpool.Pool // the books' pool, when PostgreSQL is configured
	checks   []api.Check
	closers  []func() // run in reverse order on Close
	// unavailable says, per store, how to enable it.
	unavailable map[string]string
	redisWhere  string // "embedded" or the server address

	primary *replica
	mu      sync.Mutex
	extra   []*replica      // in-process replicas, started on demand
	poolsMu sync.Mutex      // guards pools (a.mu is held while replicas start)
	pools   []*pgxpool.Pool // every pool of this lab, books' first

	cancel context.CancelFunc
	bg     sync.WaitGroup
}

// replica is one server with its own process-local state.
type replica struct {
	name   string
	server *api.Server
	stores map[string]lab.Store
	http   *http.Server
	url    string
	served chan error
}

// Start builds the lab and starts serving on cfg.Addr.
func Start(ctx context.Context, cfg Config) (*App, error) {
	cfg.Defaults()
	if len(cfg.Peers) > 0 && cfg.DatabaseURL == "" {
		return nil, errors.New("cluster mode (peers) needs a shared ledger: set DATABASE_URL to the PostgreSQL every replica uses; " +
			"an embedded or in-memory ledger would give each process its own ground truth")
	}
	if len(cfg.Peers) > 0 && cfg.RedisURL == "" {
		cfg.EmbedRedis = false // an embedded Redis per process would not be shared; the redis store needs REDIS_URL
	}
	a := &App{cfg: cfg, books: memory.NewBooks(nil), instance: "idempotency-lab-" + uuid.NewString()[:8]}
	a.unavailable = map[string]string{
		lab.StoreRedis:    "set REDIS_URL (e.g. redis://127.0.0.1:6379/0), or run lab serve with the embedded Redis (the default)",
		lab.StorePostgres: "set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test), or install the PostgreSQL server (initdb) for a throwaway cluster",
	}
	if err := a.openBooks(ctx); err != nil {
		a.closeAll()
		return nil, err
	}
	if err := a.openRedis(ctx); err != nil {
		a.closeAll()
		return nil, err
	}
	a.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128, MaxConnsPerHost: 0}, Timeout: 30 * time.Second}
	a.runner = &experiment.Runner{Client: a.client, Books: a.books, Tenants: cfg.Tenants, AdminToken: cfg.AdminToken}

	bgCtx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	r, err := a.startReplica(ctx, cfg.Replica, cfg.Addr)
	if err != nil {
		cancel()
		a.closeAll()
		return nil, err
	}
	a.primary = r
	rl := &relay.Relay{Outbox: a.books, Provider: a.books, Logger: cfg.Logger}
	a.bg.Go(func() { rl.Run(bgCtx) })
	a.bg.Go(func() { a.sweep(bgCtx) })
	return a, nil
}

// URL is the primary replica's base URL (with the base path).
func (a *App) URL() string { return a.primary.url + strings.TrimSuffix(a.cfg.BasePath, "/") }

// Books exposes the ground truth, for tests and the matrix.
func (a *App) Books() lab.Books { return a.books }

// Server is the primary replica's server.
func (a *App) Server() *api.Server { return a.primary.server }

// Served reports when the primary server stops on its own.
func (a *App) Served() <-chan error { return a.primary.served }

func (a *App) startReplica(ctx context.Context, name, addr string) (*replica, error) {
	stores := map[string]lab.Store{
		lab.StoreUnsafe: unsafe.New(a.books, a.books, nil),
		lab.StoreMemory: memory.New(memory.Config{Ledger: a.books, Window: a.cfg.Window, Wait: a.cfg.InFlightWait}),
	}
	unavailable := maps.Clone(a.unavailable)
	if a.cfg.RedisURL != "" {
		opts, err := goredis.ParseURL(a.cfg.RedisURL)
		if err != nil {
			return nil, fmt.Errorf("error parsing REDIS_URL: %w", err)
		}
		client := goredis.NewClient(opts) // each replica its own client, as a separate process would
		a.closers = append(a.closers, func() { _ = client.Close() })
		stores[lab.StoreRedis] = redis.New(redis.Config{
			Client: client, Ledger: a.books, Prefix: a.cfg.RedisPrefix, Window: a.cfg.Window,
			Wait: a.cfg.InFlightWait, ClaimTTL: a.cfg.ClaimTTL, Where: a.redisWhere,
		})
		delete(unavailable, lab.StoreRedis)
	}
	if a.pool != nil {
		// Each replica has its own pool, as a separate process would.
		pool, err := a.openPool(ctx, false)
		if err != nil {
			return nil, err
		}
		a.closers = append(a.closers, pool.Close)
		a.poolsMu.Lock()
		a.pools = append(a.pools, pool)
		a.poolsMu.Unlock()
		stores[lab.StorePostgres] = postgres.NewStore(postgres.StoreConfig{
			Pool: pool, Window: a.cfg.Window, Wait: a.cfg.InFlightWait, AppName: a.instance, ResetPools: a.resetPools,
		})
		delete(unavailable, lab.StorePostgres)
	}
	srv := api.New(api.Config{
		Replica: name, BasePath: a.cfg.BasePath, Tenants: a.cfg.Tenants, AdminToken: a.cfg.AdminToken,
		FaultsEnabled: a.cfg.FaultsEnabled, DefaultStore: a.cfg.DefaultStore, Window: a.cfg.Window, Logger: a.cfg.Logger,
	}, api.Deps{Books: a.books, Stores: stores, Unavailable: unavailable, Checks: a.checks, Runner: a.runner, Cluster: a})
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("error listening on %s: %w", addr, err)
	}
	self := ln.Addr().(*net.TCPAddr)
	if self.IP.IsUnspecified() { // listening on every interface: reach ourselves on loopback
		self = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: self.Port}
	}
	r := &replica{
		name: name, server: srv, stores: stores, url: "http://" + self.String(), served: make(chan error, 1),
		http: &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second},
	}
	go func() {
		err := r.http.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		r.served <- err
	}()
	a.cfg.Logger.Info("replica listening", "replica", name, "url", r.url)
	return r, nil
}

// Targets returns n replicas' base URLs: this one first, then peers or
// in-process replicas started on loopback ports as needed.
func (a *App) Targets(ctx context.Context, n int) ([]string, error) {
	base := strings.TrimSuffix(a.cfg.BasePath, "/")
	urls := []string{a.primary.url + base}
	if len(a.cfg.Peers) > 0 {
		if n > 1+len(a.cfg.Peers) {
			return nil, lab.Invalid("replicas", "must be in 1..%d: this cluster has %d peer(s)", 1+len(a.cfg.Peers), len(a.cfg.Peers))
		}
		return append(urls, a.cfg.Peers[:n-1]...), nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(a.extra) < n-1 {
		r, err := a.startReplica(ctx, fmt.Sprintf("r%d", len(a.extra)+2), "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		a.extra = append(a.extra, r)
	}
	for _, r := range a.extra[:n-1] {
		urls = append(urls, r.url+base)
	}
	return urls, nil
}

// MaxReplicas is how many replicas a run may spread over.
func (a *App) MaxReplicas() int {
	if len(a.cfg.Peers) > 0 {
		return 1 + len(a.cfg.Peers)
	}
	return a.cfg.MaxReplicas
}

// ResetPeers makes the other replicas forget their keys.
func (a *App) ResetPeers(ctx context.Context, adminToken string) error {
	a.mu.Lock()
	extra := append([]*replica(nil), a.extra...)
	a.mu.Unlock()
	for _, r := range extra {
		if err := r.server.ResetLocal(ctx); err != nil {
			return err
		}
	}
	for _, peer := range a.cfg.Peers {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, peer+"/reset-lab?scope=local", nil)
		if err != nil {
			return err
		}
		if adminToken != "" {
			req.Header.Set("Authorization", "Bearer "+adminToken)
		}
		resp, err := a.client.Do(req)
		if err != nil {
			return fmt.Errorf("error resetting peer %s: %w", peer, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("error resetting peer %s: status %d", peer, resp.StatusCode)
		}
	}
	return nil
}

func (a *App) replicas() []*replica {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*replica{a.primary}, a.extra...)
}

// sweep evicts expired keys from every store of every replica.
func (a *App) sweep(ctx context.Context) {
	t := time.NewTicker(a.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, r := range a.replicas() {
			for name, st := range r.stores {
				n, err := st.Sweep(ctx)
				if err != nil {
					a.cfg.Logger.Warn("sweep failed", "replica", r.name, "store", name, "err", err)
				} else if n > 0 {
					a.cfg.Logger.Info("swept expired keys", "replica", r.name, "store", name, "evicted", n)
				}
			}
		}
	}
}

// Close stops serving (in-flight requests finish), then stops the workers.
func (a *App) Close(ctx context.Context) error {
	var errs []error
	for _, r := range a.replicas() {
		if err := r.http.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("error shutting down %s: %w", r.name, err))
		}
	}
	a.cancel()
	a.bg.Wait()
	a.client.CloseIdleConnections()
	a.closeAll()
	return errors.Join(errs...)
}

// resetPools drops every pool's connections, after store_restart killed
// this lab's database sessions.
func (a *App) resetPools() {
	a.poolsMu.Lock()
	defer a.poolsMu.Unlock()
	for _, p := range a.pools {
		p.Reset()
	}
}

// closeAll releases pools and embedded services, newest first.
func (a *App) closeAll() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
}

// openBooks moves the ledger and outbox to PostgreSQL when it is configured,
// or starts a throwaway cluster when asked and PostgreSQL is installed.
func (a *App) openBooks(ctx context.Context) error {
	where := "DATABASE_URL"
	if a.cfg.DatabaseURL == "" && a.cfg.EmbedPostgres {
		if _, err := embedded.Find(); err != nil {
			a.cfg.Logger.Info("postgres store unavailable: no DATABASE_URL and no PostgreSQL server installed", "why", err)
			return nil
		}
		cluster, err := embedded.Start(ctx, a.cfg.Logger)
		if err != nil {
			a.cfg.Logger.Warn("postgres store unavailable: the throwaway cluster did not start", "err", err)
			a.unavailable[lab.StorePostgres] = "the throwaway cluster did not start (" + err.Error() + "); set DATABASE_URL"
			return nil
		}
		a.closers = append(a.closers, func() {
			if err := cluster.Close(); err != nil {
				a.cfg.Logger.Warn("stopping the throwaway cluster", "err", err)
			}
		})
		a.cfg.DatabaseURL, where = cluster.URL(), "embedded throwaway cluster, removed on exit"
		a.cfg.Logger.Info("started a throwaway PostgreSQL cluster", "url", cluster.URL())
	}
	if a.cfg.DatabaseURL == "" {
		return nil
	}
	pool, err := a.openPool(ctx, true)
	if err != nil {
		return err
	}
	a.pool = pool
	a.pools = append(a.pools, pool)
	a.closers = append(a.closers, pool.Close)
	a.books = postgres.NewBooks(pool)
	a.checks = append(a.checks, api.Check{Name: "postgres", Describe: where + ": ledger, outbox and postgres store (schema " + a.schema() + ")", Ping: pool.Ping})
	return nil
}

// openRedis connects to REDIS_URL, or starts the embedded Redis when asked.
func (a *App) openRedis(ctx context.Context) error {
	a.redisWhere = "at REDIS_URL"
	if a.cfg.RedisURL == "" && a.cfg.EmbedRedis {
		e, err := redis.StartEmbedded()
		if err != nil {
			return err
		}
		a.closers = append(a.closers, e.Close)
		a.cfg.RedisURL, a.redisWhere = e.URL(), "embedded (miniredis, in this process, TTLs on the wall clock)"
	}
	if a.cfg.RedisURL == "" {
		return nil
	}
	opts, err := goredis.ParseURL(a.cfg.RedisURL)
	if err != nil {
		return fmt.Errorf("error parsing REDIS_URL: %w", err)
	}
	client := goredis.NewClient(opts)
	a.closers = append(a.closers, func() { _ = client.Close() })
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("error connecting to Redis at %s: %w", opts.Addr, err)
	}
	a.checks = append(a.checks, api.Check{Name: "redis", Describe: "redis store, " + a.redisWhere,
		Ping: func(ctx context.Context) error { return client.Ping(ctx).Err() }})
	return nil
}

func (a *App) schema() string { return cmp.Or(a.cfg.PGSchema, postgres.DefaultSchema) }

func (a *App) openPool(ctx context.Context, migrate bool) (*pgxpool.Pool, error) {
	return postgres.Open(ctx, postgres.PoolConfig{
		URL: a.cfg.DatabaseURL, Schema: a.schema(), Size: a.cfg.PGPoolSize, AppName: a.instance, Migrate: migrate,
	})
}
