// Package app assembles a lab from its configuration: the books (PostgreSQL
// or memory), one store per registered variant on each replica, the HTTP
// servers, the outbox relay, the sweeper and the pruner. It knows no
// variant by name: the designs come in through Config.Variants.
package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api"
	"github.com/idempotency-lab/lab/lab/cost"
	"github.com/idempotency-lab/lab/lab/delivery"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/httpserve"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/labsvc"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/pgdb/throwaway"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/redisdb"
	"github.com/idempotency-lab/lab/lab/relay"
	"github.com/idempotency-lab/lab/lab/step"
	"github.com/idempotency-lab/lab/lab/tenants"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Books is the shared ground truth every part of the lab reads or writes:
// the ledger, the outbox and the payment states webhooks move.
type Books interface {
	lab.Ledger
	lab.CaptureRecorder
	relay.Outbox
	api.Books
	experiment.GroundTruth
	labsvc.Erasable
	// OutboxBacklog is the outbox's pending events alone, which a poll
	// of a drain reads (lab bench's).
	OutboxBacklog(ctx context.Context, ns lab.Namespace) (lab.OutboxBacklog, error)
}

// App is a running lab.
type App struct {
	cfg       Config
	variants  *variant.Registry
	books     Books
	client    *http.Client
	runner    *experiment.Runner
	instance  string // names this lab's database sessions
	directory *tenants.Directory
	public    tenants.Identity // who acts when a lab route's caller sends no token
	pool      *pgxpool.Pool    // the books' pool, when PostgreSQL is configured
	checks    []api.Check
	// unavailable says, per variant whose needs are not met, how to enable it.
	unavailable map[lab.StoreName]string
	redisWhere  string // "embedded …" or "at REDIS_URL"

	failover *redisFailover // the failover fault's Redis pair, if any
	pg       *pgFailover    // the pg_failover fault's PostgreSQL pair, started on first use

	drawnToken     bool              // the admin token is drawn by Start: listening beyond loopback, none was given
	secret         []byte            // signs and verifies the provider's webhooks
	providerClient *provider.Client  // the payment provider, over HTTP, for deliveries: each call bounded by ProviderTimeout
	providerAdmin  *provider.Client  // the same, for the lab's own reads and settings of it: as long as their caller waits
	ownProvider    ownRecords        // the own provider's records, read and pruned; nil with an external one
	effects        *delivery.Courier // a direct send's, recording its capture in the books
	relay          *relay.Relay
	// relayOutbox is the outbox as the relay reads it, and where its
	// deliveries record their captures: the books on the background's own
	// pool when PostgreSQL is configured.
	relayOutbox interface {
		relay.Outbox
		lab.CaptureRecorder
	}
	bgPool *pgxpool.Pool // the background's pool, committing asynchronously; nil without PostgreSQL
	meter  *cost.Meter   // counts the statements, round trips and requests of this process

	replicas *replicaSet
	// steps holds the stepped runs of this process, shared by its
	// in-process replicas: an attempt finds its gate on whichever it reaches.
	steps *step.Registry

	mu    sync.Mutex // guards what follows; never held during I/O
	pools []*pgxpool.Pool
	// budgeted are the replicas' store pools, each under one connection
	// budget per namespace.
	budgeted []*pgdb.Pool
	closers  []func() // run in reverse order on Close

	cancel context.CancelFunc
	bg     sync.WaitGroup
}

// replica is one server with its own process-local state.
type replica struct {
	name    string
	server  *api.Server
	service *labsvc.Service // its use cases: runs, history, matrices, resets
	stores  map[lab.StoreName]lab.Store
	http    *http.Server
	url     string
	served  chan error
}

// Start builds the lab and starts serving on cfg.Addr.
func Start(ctx context.Context, cfg Config) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg, err := variant.NewRegistry(cfg.Variants...)
	if err != nil {
		return nil, err
	}
	if len(cfg.Peers) > 0 && cfg.RedisURL == "" {
		cfg.EmbedRedis = false // an embedded Redis per process would not be shared; the redis store needs REDIS_URL
	}
	a := &App{cfg: cfg, variants: reg, books: inmem.NewBooks(cfg.Clock), instance: "idempotency-lab-" + uuid.NewString()[:8],
		unavailable: map[lab.StoreName]string{}, meter: cost.New()}
	if err := a.openBooks(ctx); err != nil {
		a.closeAll()
		return nil, err
	}
	if a.relayOutbox == nil {
		a.relayOutbox = a.books // in memory, nothing to share
	}
	if err := a.openRedis(ctx); err != nil {
		a.closeAll()
		return nil, err
	}
	a.openPair(ctx)
	a.pg = newPGFailover(cfg.Logger, len(cfg.Peers) > 0)
	a.pg.clock, a.pg.size, a.pg.appName = cfg.Clock, int32(cfg.PGPoolSize), a.instance+"-pair"
	a.addCloser(a.pg.Close)
	for _, v := range reg.All() {
		if how := a.missing(v); how != "" {
			a.unavailable[v.Name] = how
		} else if slices.Contains(v.Needs, variant.NeedPostgres) {
			a.pg.variants = append(a.pg.variants, v) // its keys are in PostgreSQL: a PostgreSQL failover reaches them
		}
	}
	a.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}, Timeout: 30 * time.Second}
	if a.steps, err = step.NewRegistry(step.Config{Settle: step.DefaultSettle, Idle: step.DefaultIdle}); err != nil {
		return nil, err
	}
	a.replicas = &replicaSet{basePath: cfg.BasePath, peers: cfg.Peers, max: cfg.MaxReplicas, client: a.client,
		failover: a.failover, start: a.startReplica}
	a.runner = &experiment.Runner{Client: a.client, Books: a.books, Variants: reg, Now: cfg.Clock, PGFailover: a.pg}
	var joined tenants.Joined = tenants.NewInMemory()
	if a.pool != nil {
		joined = pgdb.NewTenants(a.pool) // every replica of a cluster resolves every attendee
	}
	if a.directory, err = tenants.NewDirectory(cfg.Tenants, joined, cfg.JoinCode, cfg.MaxAttendees); err != nil {
		a.closeAll()
		return nil, err
	}
	for token, tenant := range cfg.Tenants {
		if tenant != cfg.PublicTenant {
			continue
		}
		// The directory decides a token's namespace, the public one's too.
		if a.public, _, err = a.directory.Resolve(ctx, token); err != nil {
			a.closeAll()
			return nil, fmt.Errorf("error resolving the public tenant: %w", err)
		}
	}
	// The primary listens first: the provider's webhooks come back to it.
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Addr)
	if err != nil {
		a.closeAll()
		return nil, fmt.Errorf("error listening on %s: %w", cfg.Addr, err)
	}
	// Reachable from other machines, a lab without an admin token would let
	// anyone who reaches it reset every namespace: it draws one, as a
	// notebook server draws its token, and the command prints it once.
	if self := ln.Addr().(*net.TCPAddr); !self.IP.IsLoopback() && a.cfg.AdminToken == "" {
		if len(cfg.Peers) > 0 {
			_ = ln.Close()
			a.closeAll()
			return nil, fmt.Errorf("listening on %s as a replica of a cluster without an admin token: give every replica the same -admin-token (LAB_ADMIN_TOKEN); one drawn here would differ from its peers'", self)
		}
		a.cfg.AdminToken, a.drawnToken = "lab-admin-"+rand.Text(), true
	}
	bgCtx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	if err := a.openProvider(ctx, bgCtx, selfURL(ln)+strings.TrimSuffix(cfg.BasePath, "/")+"/webhooks/provider"); err != nil {
		_ = ln.Close()
		a.stopBackground()
		a.closeAll()
		return nil, err
	}
	a.runner.Provider = a.providerAdmin
	a.pg.provider, a.pg.relay = a.providerClient, relay.Config{Clock: cfg.Clock, Logger: cfg.Logger, Settings: cfg.Relay}
	rl, err := relay.New(relay.Config{Outbox: a.relayOutbox, Provider: delivery.New(a.providerClient, a.relayOutbox), Clock: cfg.Clock, Logger: cfg.Logger, Settings: cfg.Relay})
	if err != nil {
		_ = ln.Close()
		a.stopBackground()
		a.closeAll()
		return nil, err
	}
	a.relay = rl
	r, err := a.startReplica(ctx, cfg.Replica, ln)
	if err != nil {
		_ = ln.Close()
		a.stopBackground()
		a.closeAll()
		return nil, err
	}
	a.replicas.mu.Lock()
	a.replicas.primary = r
	a.replicas.mu.Unlock()
	a.bg.Go(func() { rl.Run(bgCtx) })
	a.bg.Go(func() { a.sweep(bgCtx) })
	a.bg.Go(func() { a.complete(bgCtx, r) })
	a.bg.Go(func() { a.runPruner(bgCtx) })
	return a, nil
}

// stopBackground stops the background workers and waits for them.
func (a *App) stopBackground() {
	a.cancel()
	a.bg.Wait()
}

// selfURL is how this process reaches a listener of its own: on loopback
// when it listens on every interface.
func selfURL(ln net.Listener) string {
	self := ln.Addr().(*net.TCPAddr)
	if self.IP.IsUnspecified() {
		self = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: self.Port}
	}
	return "http://" + self.String()
}

// missing says how to enable v when one of its needs is not configured.
func (a *App) missing(v variant.Variant) string {
	for _, n := range v.Needs {
		if (n == variant.NeedRedis && a.cfg.RedisURL == "") || (n == variant.NeedPostgres && a.pool == nil) {
			if how := a.unavailable[v.Name]; how != "" {
				return how
			}
			return v.HowToEnable
		}
	}
	return ""
}

// URL is the primary replica's base URL (with the base path).
func (a *App) URL() string { return a.replicas.all()[0].url + strings.TrimSuffix(a.cfg.BasePath, "/") }

// Books exposes the ground truth, for tests and the matrix.
func (a *App) Books() Books { return a.books }

// Provider is the payment provider the lab delivers to, for tests and tools.
func (a *App) Provider() *provider.Client { return a.providerAdmin }

// QueuedWebhooks counts the provider's webhooks still to send: from the own
// provider's records, whose count follows the queue; an external
// provider's from its stats.
func (a *App) QueuedWebhooks(ctx context.Context) (int64, error) {
	if a.ownProvider != nil {
		n, err := a.ownProvider.Queued(ctx)
		return int64(n), err
	}
	st, err := a.providerAdmin.Stats(ctx, provider.Filter{})
	return int64(st.WebhooksQueued), err
}

// Public is who acts in the public namespace (lab routes without a token).
func (a *App) Public() tenants.Identity { return a.public }

// StorePools are the replicas' PostgreSQL pools the stores share, each with
// its connection budget per namespace (none without PostgreSQL).
func (a *App) StorePools() []*pgdb.Pool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*pgdb.Pool(nil), a.budgeted...)
}

// Service is the primary replica's use cases: runs, the matrices, the run
// history, resets (for commands and tests that run them without HTTP).
func (a *App) Service() *labsvc.Service { return a.replicas.all()[0].service }

// Targets returns n replicas' base URLs, starting in-process ones as needed.
func (a *App) Targets(ctx context.Context, n int) ([]string, error) {
	return a.replicas.Targets(ctx, n)
}

// PairUnavailable says why the failover fault cannot run here ("" when it can).
func (a *App) PairUnavailable() string { return a.failover.Unavailable() }

// AdminToken is the token that resets and restarts every namespace ("":
// none, on loopback: anyone on this machine may), and whether the lab drew
// it because it listens beyond loopback and was given none.
func (a *App) AdminToken() (token string, drawn bool) { return a.cfg.AdminToken, a.drawnToken }

// Served reports when the primary server stops on its own.
func (a *App) Served() <-chan error { return a.replicas.all()[0].served }

// addCloser registers a release for Close.
func (a *App) addCloser(f func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closers = append(a.closers, f)
}

func (a *App) startReplica(ctx context.Context, name string, ln net.Listener) (*replica, error) {
	deps := variant.Deps{
		Ledger: a.books, Sender: a.effects, Capturer: a.effects, Clock: a.cfg.Clock, Logger: a.cfg.Logger,
		Window: a.cfg.Window, Wait: a.cfg.InFlightWait, ClaimTTL: a.cfg.ClaimTTL,
		RedisPrefix: a.cfg.RedisPrefix, RedisWhere: a.redisWhere, AppName: a.instance, ResetPools: a.resetPools,
	}
	if a.cfg.RedisURL != "" {
		opts, err := goredis.ParseURL(a.cfg.RedisURL)
		if err != nil {
			return nil, fmt.Errorf("error parsing REDIS_URL: %w", err)
		}
		client := goredis.NewClient(opts) // each replica its own client, as a separate process would
		client.AddHook(a.meter.RedisHook())
		a.addCloser(func() { _ = client.Close() })
		deps.Redis = client
	}
	if a.failover.pair != nil {
		client := a.failover.pair.Client()
		client.AddHook(a.meter.RedisHook())
		a.addCloser(func() { _ = client.Close() })
		deps.RedisPair = client
	}
	if a.pool != nil {
		// Each replica has its own pool, as a separate process would.
		pool, err := a.openPool(ctx, false, "store")
		if err != nil {
			return nil, err
		}
		a.addCloser(pool.Close)
		a.mu.Lock()
		a.pools = append(a.pools, pool)
		a.mu.Unlock()
		deps.Postgres = pgdb.NewPool(pool)
		a.mu.Lock()
		a.budgeted = append(a.budgeted, deps.Postgres)
		a.mu.Unlock()
	}
	if len(a.replicas.all()) == 0 {
		a.pg.deps = deps // the pair's stores are the primary's, on the pair's pool and books
	}
	stores := map[lab.StoreName]lab.Store{}
	for _, v := range a.variants.All() {
		if _, off := a.unavailable[v.Name]; off {
			continue
		}
		st, err := v.Open(ctx, deps)
		if err != nil {
			return nil, fmt.Errorf("error opening store %s: %w", v.Name, err)
		}
		stores[v.Name] = st
	}
	var relayCounts func() relay.Counts
	var meter *cost.Meter
	if len(a.replicas.all()) == 0 { // the primary's metrics carry this process's relay and costs
		relayCounts, meter = a.relay.Counts, a.meter
	}
	svc, err := labsvc.New(labsvc.Config{Runner: a.runner, Books: a.books, Provider: a.providerAdmin, Variants: a.variants,
		Stores: stores, Unavailable: maps.Clone(a.unavailable), Replicas: a.replicas, Replica: name, Window: a.cfg.Window, Steps: a.steps,
		Failover: a.failover, PGFailover: a.pg, MaxRuns: a.cfg.MaxRuns})
	if err != nil {
		return nil, err
	}
	srv := api.New(api.Config{
		WebhookSecret: a.secret, StuckAfter: a.cfg.StuckAfter, Replica: name, BasePath: a.cfg.BasePath, Public: a.public, AdminToken: a.cfg.AdminToken,
		FaultsEnabled: a.cfg.FaultsEnabled, DefaultStore: a.cfg.DefaultStore, Window: a.cfg.Window, Clock: a.cfg.Clock, Logger: a.cfg.Logger,
	}, api.Deps{Books: a.books, Directory: a.directory, Variants: a.variants, Stores: stores, Unavailable: maps.Clone(a.unavailable),
		Checks: a.checks, Service: svc, Failover: a.failover, RelayCounts: relayCounts, Provider: a.providerAdmin, Cost: meter})
	r := &replica{
		name: name, server: srv, service: svc, stores: stores, url: selfURL(ln), served: make(chan error, 1),
		http: httpserve.New(srv.Handler(), a.cfg.Timeouts()),
	}
	go func() {
		err := r.http.Serve(httpserve.Listener(ln))
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		r.served <- err
	}()
	a.cfg.Logger.Info("replica listening", "replica", name, "url", r.url)
	return r, nil
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
		for _, r := range a.replicas.all() {
			for name, st := range r.stores {
				sw, ok := st.(lab.Sweeper)
				if !ok {
					continue
				}
				n, err := sw.Sweep(ctx)
				if err != nil {
					a.cfg.Logger.Warn("sweep failed", "replica", r.name, "store", name, "err", err)
				} else if n > 0 {
					r.server.CountSwept(name, n)
					a.cfg.Logger.Info("swept expired keys", "replica", r.name, "store", name, "evicted", n)
				}
			}
		}
	}
}

// completeEvery is how often the completer looks for unfinished keys.
const completeEvery = 250 * time.Millisecond

// complete runs this process's completer: the primary replica's stores
// that finish what crashed requests left (the others share their tables).
func (a *App) complete(ctx context.Context, r *replica) {
	t := time.NewTicker(completeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for name, st := range r.stores {
			c, ok := st.(lab.Completer)
			if !ok {
				continue
			}
			if n, err := c.Complete(ctx); err != nil && ctx.Err() == nil {
				a.cfg.Logger.Warn("completer pass failed", "store", name, "finished", n, "err", err)
			}
		}
	}
}

// Close stops serving (in-flight requests finish), then stops the workers.
func (a *App) Close(ctx context.Context) error {
	var errs []error
	a.steps.Close() // its attempts wait at their points: end them before the servers wait for them
	for _, r := range a.replicas.all() {
		if err := r.http.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("error shutting down %s: %w", r.name, err))
		}
	}
	a.stopBackground()
	a.client.CloseIdleConnections()
	a.closeAll()
	return errors.Join(errs...)
}

// DropConnections closes every PostgreSQL connection the lab holds (those
// in use, when released); pools open new ones as they are needed. A load
// generator calls it between phases, so idle connections of one phase
// never crowd the server's connection limit in the next.
func (a *App) DropConnections() { a.resetPools() }

// HoldDelivery stops (true) or resumes (false) this process's outbox relay:
// charges still write their events, which wait until it resumes.
func (a *App) HoldDelivery(held bool) { a.relay.Hold(held) }

// resetPools drops every pool's connections, after store_restart killed
// this lab's database sessions.
func (a *App) resetPools() {
	a.mu.Lock()
	pools := append([]*pgxpool.Pool(nil), a.pools...)
	a.mu.Unlock()
	for _, p := range pools {
		p.Reset()
	}
}

// closeAll releases pools and embedded services, newest first.
func (a *App) closeAll() {
	a.mu.Lock()
	closers := a.closers
	a.closers = nil
	a.mu.Unlock()
	for i := len(closers) - 1; i >= 0; i-- {
		closers[i]()
	}
}

// openBooks moves the ledger and outbox to PostgreSQL when it is configured,
// or starts a throwaway cluster when asked and PostgreSQL is installed.
func (a *App) openBooks(ctx context.Context) error {
	where := "DATABASE_URL"
	if a.cfg.DatabaseURL == "" && a.cfg.EmbedPostgres {
		if _, err := throwaway.Find(); err != nil {
			a.cfg.Logger.Info("postgres store unavailable: no DATABASE_URL and no PostgreSQL server installed", "why", err)
			return nil
		}
		cluster, err := throwaway.Start(ctx, a.cfg.Logger)
		if err != nil {
			a.cfg.Logger.Warn("postgres store unavailable: the throwaway cluster did not start", "err", err)
			for _, v := range a.variants.All() {
				if slices.Contains(v.Needs, variant.NeedPostgres) {
					a.unavailable[v.Name] = "the throwaway cluster did not start (" + err.Error() + "); set DATABASE_URL"
				}
			}
			return nil
		}
		a.addCloser(func() {
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
	pool, err := a.openPool(ctx, true, "books")
	if err != nil {
		return err
	}
	a.pool = pool
	a.mu.Lock()
	a.pools = append(a.pools, pool)
	a.mu.Unlock()
	a.addCloser(pool.Close)
	a.books = pgdb.NewBooks(pool, a.cfg.Clock)
	// The relay's work goes through a pool of its own: attendees' charges,
	// however many, never take the connections that deliver their effects.
	// Each worker (as many as the backlog calls for) claims with one
	// connection, then completes its batch's deliveries as they end, a few
	// at once. The provider's webhooks are claimed and acknowledged on it
	// too. Its commits do not wait for the WAL flush: each is a claim or
	// an acknowledgement whose loss in a crash repeats a delivery, which
	// the provider (capture key, receipt event id) or the lab (webhook
	// event id) deduplicates, and waiting on the flush for each was most of
	// what a delivery cost.
	bg, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: a.cfg.DatabaseURL, Schema: a.cfg.PGSchema,
		Size: int32(min(a.cfg.Relay.MaxWorkers*(1+a.cfg.Relay.Concurrency/4), 16)), AppName: a.instance, AsyncCommit: true,
		Tracer: a.meter.SQL(cost.Lab, "background", false)})
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.pools = append(a.pools, bg)
	a.mu.Unlock()
	a.addCloser(bg.Close)
	a.relayOutbox, a.bgPool = pgdb.NewBooks(bg, a.cfg.Clock), bg
	a.checks = append(a.checks, api.Check{Name: "postgres", Describe: where + ": ledger, outbox and postgres store (schema " + a.cfg.PGSchema + ")", Ping: pool.Ping})
	return nil
}

// openRedis connects to REDIS_URL, or starts the embedded Redis when asked.
func (a *App) openRedis(ctx context.Context) error {
	a.redisWhere = "at REDIS_URL"
	if a.cfg.RedisURL == "" && a.cfg.EmbedRedis {
		e, err := redisdb.StartEmbedded()
		if err != nil {
			return err
		}
		a.addCloser(e.Close)
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
	a.addCloser(func() { _ = client.Close() })
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("error connecting to Redis at %s: %w", opts.Addr, err)
	}
	a.checks = append(a.checks, api.Check{Name: "redis", Describe: "redis store, " + a.redisWhere,
		Ping: func(ctx context.Context) error { return client.Ping(ctx).Err() }})
	return nil
}

// openPool opens a pool of the lab's, counted under name.
func (a *App) openPool(ctx context.Context, migrate bool, name string) (*pgxpool.Pool, error) {
	return pgdb.Open(ctx, pgdb.PoolConfig{
		URL: a.cfg.DatabaseURL, Schema: a.cfg.PGSchema, Size: int32(a.cfg.PGPoolSize), AppName: a.instance, Migrate: migrate,
		Tracer: a.meter.SQL(cost.Lab, name, true),
	})
}
