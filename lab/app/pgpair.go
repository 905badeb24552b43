package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/delivery"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/pgdb/throwaway"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/relay"
	"github.com/idempotency-lab/lab/lab/variant"
)

// pgFailover is the lab's own PostgreSQL primary and streaming standby,
// which only pg_failover runs reach: their attempts charge through stores
// opened on it, never on the lab's database, and the runs step it through
// a failover, one namespace's at a time. It starts on first use.
type pgFailover struct {
	log      *slog.Logger
	how      string // why no pair can start here, "" when one can
	variants []variant.Variant
	deps     variant.Deps // the primary replica's, for the stores opened on the pair
	provider *provider.Client
	relay    relay.Config // for the deliveries from each primary's outbox
	clock    lab.Clock
	size     int32
	appName  string

	port  atomic.Int32               // the primary new connections go to
	ready atomic.Pointer[pairStores] // set once started

	mu     sync.Mutex // one step at a time; guards what follows
	pair   *throwaway.Pair
	holder lab.Namespace // whose failover is under way, "" when none
	since  time.Time
	moved  bool // the holder's failover promoted the standby
	waited bool // a commit waited for the standby when it was promoted
}

// pairStores is what runs on the pair once it started.
type pairStores struct {
	pool   *pgxpool.Pool
	books  *pgdb.Books
	stores map[lab.StoreName]lab.Store
}

// pgTurn bounds how long one namespace's failover keeps the pair: past it,
// the next failover ends it (promoting and rebuilding) and goes.
const pgTurn = 30 * time.Second

// pairStart bounds the pair's start: initdb, a base backup, two servers.
const pairStart = time.Minute

// newPGFailover prepares the pair; how says why it cannot start.
func newPGFailover(log *slog.Logger, clustered bool) *pgFailover {
	f := &pgFailover{log: log}
	if clustered {
		f.how = "in cluster mode every process would fail a pair of its own over; run one process to see a PostgreSQL failover"
	} else if _, err := throwaway.Find(); err != nil {
		f.how = err.Error() + "; the pg_failover fault starts a primary and a standby from them"
	}
	return f
}

// Unavailable says why pg_failover cannot run here ("" when it can).
func (f *pgFailover) Unavailable() string { return f.how }

// start starts the pair, migrates its schema and opens the stores on it
// (f.mu held).
func (f *pgFailover) start(ctx context.Context) (*pairStores, error) {
	if s := f.ready.Load(); s != nil {
		return s, nil
	}
	if f.how != "" {
		return nil, fmt.Errorf("%w: %s", lab.ErrStoreUnavailable, f.how)
	}
	ctx, cancel := context.WithTimeout(ctx, pairStart)
	defer cancel()
	pair, err := throwaway.StartPair(ctx, f.log, throwaway.Async)
	if err != nil {
		return nil, fmt.Errorf("%w: the PostgreSQL pair did not start: %w", lab.ErrStoreUnavailable, err)
	}
	f.port.Store(int32(pair.Primary().Port()))
	pool, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: pair.Primary().URL(), Schema: pgdb.DefaultSchema, Size: f.size,
		AppName: f.appName, Migrate: true, BeforeConnect: f.toPrimary})
	if err != nil {
		return nil, errors.Join(err, pair.Close())
	}
	s := &pairStores{pool: pool, books: pgdb.NewBooks(pool, f.clock), stores: map[lab.StoreName]lab.Store{}}
	for _, v := range f.variants {
		st, err := v.Open(ctx, f.depsOn(pool))
		if err != nil {
			pool.Close()
			return nil, errors.Join(fmt.Errorf("error opening store %s on the PostgreSQL pair: %w", v.Name, err), pair.Close())
		}
		s.stores[v.Name] = st
	}
	f.pair = pair
	f.ready.Store(s)
	f.log.Info("started a PostgreSQL primary and standby for the pg_failover fault", "primary", pair.Primary().Port())
	return s, nil
}

// depsOn are the primary replica's deps with pool for the store's
// PostgreSQL and books: a store opened with them keeps everything on the
// pair's server that pool reaches.
func (f *pgFailover) depsOn(pool *pgxpool.Pool) variant.Deps {
	deps := f.deps
	deps.Postgres, deps.Ledger, deps.RedisPair = pgdb.NewPool(pool), pgdb.NewBooks(pool, f.clock), nil
	return deps
}

// poolOn opens a small pool on one server of the pair, for a read or a
// fence of that server alone.
func (f *pgFailover) poolOn(ctx context.Context, c *throwaway.Cluster) (*pgxpool.Pool, error) {
	pool, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: c.URL(), Schema: pgdb.DefaultSchema, Size: 2, AppName: f.appName + "-direct"})
	if err != nil {
		return nil, fmt.Errorf("error reaching the PostgreSQL server on port %d: %w", c.Port(), err)
	}
	return pool, nil
}

// toPrimary sends a new connection to the primary of the moment.
func (f *pgFailover) toPrimary(_ context.Context, cc *pgx.ConnConfig) error {
	cc.Host, cc.Port, cc.Fallbacks = "127.0.0.1", uint16(f.port.Load()), nil
	return nil
}

// started is the pair's stores, starting the pair on first use.
func (f *pgFailover) started(ctx context.Context) (*pairStores, error) {
	if s := f.ready.Load(); s != nil {
		return s, nil // never waits on a failover's step: a first attempt may hold it up
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.start(ctx)
}

// Store is the named store on the pair.
func (f *pgFailover) Store(ctx context.Context, name lab.StoreName) (lab.Store, error) {
	s, err := f.started(ctx)
	if err != nil {
		return nil, err
	}
	st, ok := s.stores[name]
	if !ok {
		return nil, lab.Invalid("store", "pg_failover fails over the PostgreSQL that holds the keys, and %s keeps none there: run it on a store that does (postgres, lease, phases, redis+postgres)", name)
	}
	return st, nil
}

// Books are the pair's books, on its primary of the moment.
func (f *pgFailover) Books(ctx context.Context) (experiment.GroundTruth, error) {
	s, err := f.started(ctx)
	if err != nil {
		return nil, err
	}
	return s.books, nil
}

// Reset deletes a namespace's rows on the pair, if it ever started.
func (f *pgFailover) Reset(ctx context.Context, ns lab.Namespace) error {
	if s := f.ready.Load(); s != nil {
		return s.books.Reset(ctx, ns)
	}
	return nil
}

// Hold takes the pair for ns's failover and stops its standby receiving
// WAL, once the standby has everything before (so only the run's writes
// are at stake), replicating in mode.
func (f *pgFailover) Hold(ctx context.Context, ns lab.Namespace, mode lab.Replication) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.start(ctx); err != nil {
		return err
	}
	if f.holder != "" && f.holder != ns && time.Since(f.since) < pgTurn {
		return lab.ErrFailoverUnderWay
	}
	if f.holder != "" { // a failover nobody settled: end it first
		f.log.Warn("ending a PostgreSQL failover nobody settled", "held_by", f.holder)
		if err := f.end(ctx); err != nil {
			return err
		}
	}
	if err := f.pair.WaitCaughtUp(ctx); err != nil {
		return err
	}
	if err := f.pair.SetReplication(ctx, throwaway.Replication(mode)); err != nil {
		return err
	}
	if err := f.pair.Hold(ctx); err != nil {
		return err
	}
	f.holder, f.since, f.moved, f.waited = ns, time.Now(), false, false
	return nil
}

// Promote delivers what the old primary's outbox holds (its relay was
// polling it), then promotes the standby; with answered non-nil, once a
// commit waits for the standby, or answered is closed (the first attempt
// answered without committing: a replay, a refusal), or 10 s passed.
func (f *pgFailover) Promote(ctx context.Context, ns lab.Namespace, answered <-chan struct{}) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holder != ns || f.moved {
		return lab.ErrFailoverUnderWay
	}
	old := f.ready.Load().books
	f.deliver(ctx, old)
	if answered != nil {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		go func() {
			select {
			case <-answered:
				cancel()
			case <-wctx.Done():
			}
		}()
		f.waited = f.pair.AwaitCommitWaiting(wctx) == nil
		cancel()
	}
	if err := f.promote(ctx); err != nil {
		return err
	}
	f.moved = true
	return nil
}

// Fence ends every session on ns's old primary, as a cluster manager
// fencing it would: a commit still waiting there for the standby fails
// instead of ever being acknowledged.
func (f *pgFailover) Fence(ctx context.Context, ns lab.Namespace) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holder != ns || !f.moved {
		return lab.ErrFailoverUnderWay
	}
	pool, err := f.poolOn(ctx, f.pair.Old())
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`)
	return err
}

// Inspect reads store's row for sc on each server of the pair (the
// primary, and the standby or, once promoted, the old primary) with the
// WAL each has written or replayed: what a failover now would keep.
func (f *pgFailover) Inspect(ctx context.Context, name lab.StoreName, sc lab.Scope) []lab.KeyInspection {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []lab.KeyInspection
	if f.pair == nil {
		return out
	}
	for _, srv := range []struct {
		role string
		c    *throwaway.Cluster
	}{{"primary", f.pair.Primary()}, {"standby", f.pair.Standby()}, {"old primary", f.pair.Old()}} {
		if srv.c != nil {
			out = append(out, f.inspectOn(ctx, srv.role, srv.c, name, sc))
		}
	}
	return out
}

// inspectOn opens store name on server c alone and inspects sc there.
func (f *pgFailover) inspectOn(ctx context.Context, role string, c *throwaway.Cluster, name lab.StoreName, sc lab.Scope) lab.KeyInspection {
	where := fmt.Sprintf("%s (port %d)", role, c.Port())
	in := lab.KeyInspection{Where: where, State: "unknown", Facts: []string{}}
	pool, err := f.poolOn(ctx, c)
	if err != nil {
		in.Facts = append(in.Facts, err.Error())
		return in
	}
	defer pool.Close()
	var wal string
	if err := pool.QueryRow(ctx, `SELECT CASE WHEN pg_is_in_recovery()
		THEN 'replayed up to ' || coalesce(pg_last_wal_replay_lsn()::text, 'nothing') || ', received up to ' || coalesce(pg_last_wal_receive_lsn()::text, 'nothing')
		ELSE 'written up to ' || pg_current_wal_lsn()::text END`).Scan(&wal); err != nil {
		wal = err.Error()
	}
	for _, v := range f.variants {
		if v.Name != name {
			continue
		}
		st, err := v.Open(ctx, f.depsOn(pool))
		if ki, ok := st.(lab.KeyInspector); ok && err == nil {
			if in, err = ki.Inspect(ctx, sc); err != nil {
				in.Facts = append(in.Facts, err.Error())
			}
			in.Where, in.Shared = where+": "+in.Where, false
		}
	}
	in.Facts = append(in.Facts, "WAL "+wal)
	return in
}

// promote promotes the standby and sends new connections to it.
func (f *pgFailover) promote(ctx context.Context) error {
	if err := f.pair.Promote(ctx); err != nil {
		return err
	}
	f.port.Store(int32(f.pair.Primary().Port()))
	f.ready.Load().pool.Reset() // connections to the old primary go as they are given back
	return nil
}

// Settle delivers the new primary's outbox, reads the run's charges on
// both servers, then rebuilds the pair.
func (f *pgFailover) Settle(ctx context.Context, ns lab.Namespace, run string) (experiment.FailoverEvidence, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := experiment.FailoverEvidence{Replication: lab.Replication(f.pair.Replication()), CommitWaited: f.waited}
	if f.holder != ns {
		return ev, lab.ErrFailoverUnderWay
	}
	if !f.moved {
		return ev, f.end(ctx)
	}
	s := f.ready.Load()
	f.deliver(ctx, s.books)
	var err error
	if ev.NewPrimary, err = s.books.Payments(ctx, ns, run, 64); err != nil {
		return ev, errors.Join(err, f.end(ctx))
	}
	if ev.OldPrimary, err = f.oldCharges(ctx, ns, run); err != nil {
		return ev, errors.Join(err, f.end(ctx))
	}
	ev.Lost = experiment.LostCharges(ev.OldPrimary, ev.NewPrimary)
	return ev, f.end(ctx)
}

// oldCharges reads the run's charges on the old primary, still running.
func (f *pgFailover) oldCharges(ctx context.Context, ns lab.Namespace, run string) ([]lab.Payment, error) {
	pool, err := f.poolOn(ctx, f.pair.Old())
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	return pgdb.NewBooks(pool, f.clock).Payments(ctx, ns, run, 64)
}

// end finishes whatever failover is under way (promoting a standby still
// held) and rebuilds the pair for the next one.
func (f *pgFailover) end(ctx context.Context) error {
	defer func() { f.holder = "" }()
	if !f.moved {
		if err := f.promote(ctx); err != nil {
			return err
		}
	}
	return f.pair.Rebuild(ctx)
}

// deliver runs one turn of a relay on books' outbox, as the relay polling
// that primary would: what it captures is money moved, whatever a failover
// does to the books afterwards.
func (f *pgFailover) deliver(ctx context.Context, books *pgdb.Books) {
	cfg := f.relay
	cfg.Outbox, cfg.Provider = books, delivery.New(f.provider, books)
	r, err := relay.New(cfg)
	if err == nil {
		_, err = r.Tick(ctx)
	}
	if err != nil {
		f.log.Warn("a delivery from the PostgreSQL pair failed", "err", err)
	}
}

// Close stops the pair.
func (f *pgFailover) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.ready.Load(); s != nil {
		s.pool.Close()
	}
	if f.pair != nil {
		if err := f.pair.Close(); err != nil {
			f.log.Warn("error stopping the PostgreSQL pair", "err", err)
		}
	}
}
