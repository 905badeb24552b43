package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/variant"
)

// tb is what the helpers need from a *testing.T or a *rapid.T.
type tb interface {
	rapid.TB
	Context() context.Context
}

// books are the ground truth a store charges, and what the tests read back.
type books interface {
	lab.Ledger
	KeyCharges(ctx context.Context, tenant string, store lab.StoreName, key string) (lab.KeyTally, error)
}

// Redis servers a variant needing Redis runs on.
const (
	redisEmbedded = "embedded" // in-process miniredis: its TTL clock can jump
	redisReal     = "real"     // REDIS_URL: TTLs run on the server's wall clock
)

// backend is one (variant, services) pair the tests run on.
type backend struct {
	name     string // subtest name: memory, redis-embedded, redis-real, postgres
	v        variant.Variant
	redis    string // "", redisEmbedded or redisReal
	postgres bool
}

// backends lists the backends v runs on: Redis both embedded and real
// when it needs Redis, beside PostgreSQL when it needs that.
func backends(v variant.Variant) []backend {
	needs := map[variant.Need]bool{}
	for _, n := range v.Needs {
		needs[n] = true
	}
	modes := []string{""}
	if needs[variant.NeedRedis] {
		modes = []string{redisEmbedded, redisReal}
	}
	var out []backend
	for _, mode := range modes {
		b := backend{name: string(v.Name), v: v, redis: mode, postgres: needs[variant.NeedPostgres]}
		if mode != "" {
			b.name += "-" + mode
		}
		out = append(out, b)
	}
	return out
}

// services are the servers one test owns: an embedded Redis, a key prefix
// on the real one, a PostgreSQL schema of its own.
type services struct {
	b          backend
	mr         *miniredis.Miniredis
	redis      *goredis.Client
	redisWhere string
	prefix     string
	pool       *pgxpool.Pool
	schema     string
	appName    string
}

func startServices(t *testing.T, b backend) *services {
	t.Helper()
	s := &services{b: b, appName: "lab-conformance"}
	var url string
	switch b.redis {
	case redisEmbedded:
		// The lab's embedded Redis (redisdb.StartEmbedded) with the same
		// settings — TTLs on the wall clock — but reachable, so that tests
		// can FastForward its clock.
		s.mr = miniredis.NewMiniRedis()
		s.mr.ClockTTL(true)
		if err := s.mr.StartAddr("127.0.0.1:0"); err != nil {
			t.Fatalf("starting embedded redis: %v", err)
		}
		t.Cleanup(s.mr.Close)
		url, s.prefix, s.redisWhere = "redis://"+s.mr.Addr()+"/0", "lab-conformance:", "embedded"
	case redisReal:
		url, s.prefix = labtest.Redis(t)
		s.redisWhere = "REDIS_URL"
	}
	if url != "" {
		opts, err := goredis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		s.redis = goredis.NewClient(opts)
		t.Cleanup(func() { _ = s.redis.Close() })
	}
	if b.postgres {
		var dbURL string
		dbURL, s.schema = labtest.Postgres(t)
		s.appName = "lab-conformance-" + s.schema // Restart kills exactly this test's sessions
		pool, err := pgdb.Open(context.Background(), pgdb.PoolConfig{URL: dbURL, Schema: s.schema, Size: 20, AppName: s.appName, Migrate: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s.pool = pool
		// Open a few connections now, so that a short bounded wait is spent
		// on locks, not on connecting.
		conns := make([]*pgxpool.Conn, 4)
		for i := range conns {
			if conns[i], err = pool.Acquire(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range conns {
			c.Release()
		}
	}
	return s
}

// settings are a store's parameters.
type settings struct {
	window, wait, claimTTL time.Duration
	prefix                 string // appended to the services' Redis prefix
}

// env is one open store with its books and clock.
type env struct {
	b     backend
	svc   *services
	deps  variant.Deps
	store lab.Store
	books books
	clock *labtest.Clock // the stores' clock
}

// outboxOnly refuses direct sends: a keyed design's effects leave through
// the outbox, written with its charge.
type outboxOnly struct{}

func (outboxOnly) SendDirect(context.Context, lab.Event) error {
	return errors.New("a keyed design sent an effect directly, outside its transaction")
}

// provider stands for the payment provider of a design that captures
// inline: one capture per key, a second call replaying it.
type provider struct {
	mu       sync.Mutex
	captures map[string]string // capture key → capture id
}

func (p *provider) CaptureInline(_ context.Context, e lab.Event, fault string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := lab.DerivedCaptureKey(e.ChargeID)
	id, ok := p.captures[key]
	if !ok {
		id = "cap_" + e.ChargeID
		p.captures[key] = id
	}
	if fault != "" {
		return "", fmt.Errorf("the provider applied capture %s and its answer was lost", id)
	}
	return id, nil
}

// open builds the variant's store the way the lab does, through its Open.
func (s *services) open(t tb, cfg settings) *env {
	t.Helper()
	c := labtest.NewClock(time.Now().Truncate(time.Second)) // frozen: moved only by hand
	var bk books = inmem.NewBooks(c.Now)
	if s.pool != nil {
		bk = pgdb.NewBooks(s.pool, c.Now) // the postgres store writes the ledger in its own transaction
	}
	deps := variant.Deps{
		Ledger: bk, Sender: outboxOnly{}, Capturer: &provider{captures: map[string]string{}}, Clock: c.Now, Logger: slog.New(slog.DiscardHandler),
		Window: cfg.window, Wait: cfg.wait, ClaimTTL: cfg.claimTTL,
		Redis: s.redis, RedisPrefix: s.prefix + cfg.prefix, RedisWhere: s.redisWhere,
		AppName: s.appName,
	}
	if s.pool != nil {
		deps.Postgres = pgdb.NewPool(s.pool)
	}
	st, err := s.b.v.Open(context.Background(), deps)
	if err != nil {
		t.Fatalf("opening %s: %v", s.b.v.Name, err)
	}
	return &env{b: s.b, svc: s, deps: deps, store: st, books: bk, clock: c}
}

// replica opens another replica of the store, as another process would:
// its own state, the same servers, books and clock.
func (e *env) replica(t tb) lab.Store {
	t.Helper()
	st, err := e.b.v.Open(context.Background(), e.deps)
	if err != nil {
		t.Fatalf("opening another %s replica: %v", e.b.v.Name, err)
	}
	return st
}

// attempt builds one attempt of this store.
func (e *env) attempt(tenant, key string, amount int64, order string, f lab.Faults) lab.Attempt {
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: amount, Currency: "USD", OrderID: order}
	return lab.Attempt{
		Scope: lab.Scope{Namespace: lab.NamespaceOf(tenant), Tenant: tenant, Endpoint: lab.Endpoint, Key: key}, Request: req,
		Fingerprint: req.Fingerprint(), Store: e.b.v.Name, Run: "conformance", Faults: f,
	}
}

func (e *env) charge(t tb, a lab.Attempt) (lab.Outcome, error) {
	out, err := e.store.Charge(t.Context(), a)
	// Shed on a busy machine (no connection in time): the store did
	// nothing, as its 503 says, and a client sends the attempt again.
	for try := 1; try < 5 && errors.Is(err, lab.ErrStoreUnavailable); try++ {
		out, err = e.store.Charge(t.Context(), a)
	}
	if err == nil && out.Pending != nil {
		// 202 Accepted under a live lease is that design's "still in
		// progress, ask again": the checks treat it as the 409 it stands for.
		return out, &lab.InProgressError{RetryAfter: time.Second}
	}
	return out, err
}

// tally is what the ledger holds for one key.
func (e *env) tally(t tb, tenant, key string) lab.KeyTally {
	t.Helper()
	k, err := e.books.KeyCharges(context.Background(), tenant, e.b.v.Name, key)
	if err != nil {
		t.Fatalf("reading the ledger: %v", err)
	}
	return k
}

// lookup reports a key's state, when the store can tell.
func (e *env) lookup(t tb, sc lab.Scope) (string, bool) {
	t.Helper()
	kl, ok := e.store.(lab.KeyLooker)
	if !ok {
		return "", false
	}
	k, err := kl.Lookup(context.Background(), sc)
	st := k.State
	if err != nil {
		t.Fatalf("looking up %s: %v", sc, err)
	}
	return st, true
}

// elapse lets d pass on the clock the store's keys expire by: the lab's
// clock for memory and postgres, the server's for Redis. The embedded
// server's clock jumps; the real one cannot, so elapse waits, bounded, for
// the given keys' TTLs (all at most d) to run out.
func (e *env) elapse(t tb, d time.Duration, scopes ...lab.Scope) {
	t.Helper()
	e.clock.Advance(d)
	switch e.b.redis {
	case redisEmbedded:
		e.svc.mr.FastForward(d)
	case redisReal:
		for _, sc := range scopes {
			deadline := time.Now().Add(d + 10*time.Second)
			for {
				st, ok := e.lookup(t, sc)
				if !ok {
					_ = lab.Sleep(t.Context(), d)
					break
				}
				if st == lab.KeyAbsent {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("key %s still %s on the Redis server 10s after its TTL (at most %s) ran out", sc.Key, st, d)
				}
				_ = lab.Sleep(t.Context(), 10*time.Millisecond)
			}
		}
	}
}

// waitInFlight waits, bounded, until an owner holds sc's claim: in the store
// where it can be seen (memory, Redis), or in PostgreSQL's own locks, since
// an uncommitted claim is invisible to other sessions.
func (e *env) waitInFlight(t tb, sc lab.Scope) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var held bool
		if st, ok := e.lookup(t, sc); ok && st == lab.KeyInFlight {
			held = true // a committed claim (memory, redis, lease)
		} else if e.svc.pool != nil {
			// A session of this schema sits in its open transaction after
			// writing into idempotency_requests: it owns a claim. The write
			// lock alone is not enough (parsing the INSERT takes it before
			// the row exists); a transaction id is only assigned by the
			// first row it writes.
			err := e.svc.pool.QueryRow(context.Background(), `
				SELECT count(*) > 0
				FROM pg_locks l
				JOIN pg_class c ON c.oid = l.relation
				JOIN pg_namespace n ON n.oid = c.relnamespace
				JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE n.nspname = $1 AND c.relname IN ('idempotency_requests', 'cached_requests') AND l.mode = 'RowExclusiveLock'
				  AND l.granted AND a.state = 'idle in transaction' AND a.backend_xid IS NOT NULL`, e.svc.schema).Scan(&held)
			if err != nil {
				t.Fatalf("reading locks: %v", err)
			}
		} else if _, ok := e.lookup(t, sc); !ok {
			t.Fatalf("%s cannot report a key in flight", e.b.v.Name)
		}
		if held {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the owner of %s never held its claim", sc.Key)
		}
		_ = lab.Sleep(t.Context(), 2*time.Millisecond)
	}
}

// verdictCharges is the number of ledger charges a sequential scenario
// leaves under a verdict: once when the design holds, twice when it breaks.
func verdictCharges(v lab.Verdict) int {
	if v == lab.Holds {
		return 1
	}
	return 2
}

// promised is the verdict the variant declares for case c under faults f.
func promised(t tb, v variant.Variant, c variant.Case, f lab.Faults) lab.Verdict {
	t.Helper()
	m, ok := v.Mechanisms[c]
	if !ok {
		t.Fatalf("variant %s declares no usual verdict for case %q: the conformance suite checks each store against its declaration", v.Name, c)
	}
	return m.Expected(f)
}

// racesTwins reports a design whose concurrent retries break, as it
// declares: nothing marks a key taken before its answer is written, so
// attempts that overlap each charge, and none of them waits for another.
func racesTwins(t tb, v variant.Variant) bool {
	t.Helper()
	return promised(t, v, variant.CaseRetries, lab.Faults{}) == lab.Breaks
}

// oneAtATime is the verdict of case c when no two attempts of one tenant
// overlap, as in the scenarios and the state machine, where retries go one
// at a time. It is the declared one, except that a design whose twins race
// declares crash_after_claim, outbox_fail and tenants broken only because
// the matrix releases their retries, or a tenant's attempts, together: one
// at a time they find nothing charged, or the first one's answer, and
// charge once.
func oneAtATime(t tb, v variant.Variant, c variant.Case, f lab.Faults) lab.Verdict {
	t.Helper()
	switch c {
	case variant.FaultCase(lab.FaultCrashAfterClaim), variant.FaultCase(lab.FaultOutboxFail), variant.CaseTenants:
		if racesTwins(t, v) {
			return lab.Holds
		}
	}
	return promised(t, v, c, f)
}

// chargeBody decodes a 201's body.
func chargeBody(t tb, r lab.Response) lab.Charge {
	t.Helper()
	if r.Status != http.StatusCreated {
		t.Fatalf("status %d (%s), want 201", r.Status, r.Body)
	}
	var c lab.Charge
	if err := json.Unmarshal(r.Body, &c); err != nil {
		t.Fatalf("decoding the charge %q: %v", r.Body, err)
	}
	return c
}

// describe renders an attempt's answer for failure messages.
func describe(out lab.Outcome, err error) string {
	if err != nil {
		var ip *lab.InProgressError
		if errors.As(err, &ip) {
			return fmt.Sprintf("409 in progress (retry after %s)", ip.RetryAfter)
		}
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%d replayed=%v %s", out.Response.Status, out.Replayed, out.Response.Body)
}
