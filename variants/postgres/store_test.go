package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/variants/postgres"
)

type env struct {
	url, schema string
	books       *pgdb.Books
	pool        *pgxpool.Pool
}

// setup gives the test a schema of its own and the books on it.
func setup(t testing.TB) env {
	t.Helper()
	url, schema := labtest.Postgres(t)
	pool := openPool(t, url, schema, true)
	return env{url: url, schema: schema, books: pgdb.NewBooks(pool, time.Now), pool: pool}
}

func openPool(t testing.TB, url, schema string, migrate bool) *pgxpool.Pool {
	t.Helper()
	pool, err := pgdb.Open(context.Background(), pgdb.PoolConfig{URL: url, Schema: schema, Size: 20, Migrate: migrate, AppName: "lab-test-" + schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newStore builds a store on cfg, with the lab's defaults where cfg has none.
func newStore(tb testing.TB, cfg postgres.Config) *postgres.Store {
	tb.Helper()
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Window == 0 {
		cfg.Window = 24 * time.Hour
	}
	if cfg.Wait == 0 {
		cfg.Wait = 2 * time.Second
	}
	if cfg.AppName == "" {
		cfg.AppName = "lab-test"
	}
	if cfg.Table == "" {
		cfg.Table = postgres.DefaultTable
	}
	s, err := postgres.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func attempt(tenant, key string, amount int64, orderID string) lab.Attempt {
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: amount, Currency: "USD", OrderID: orderID}
	return lab.Attempt{
		Scope: lab.Scope{Namespace: lab.NamespaceOf(tenant), Tenant: tenant, Endpoint: lab.Endpoint, Key: key}, Request: req,
		Fingerprint: req.Fingerprint(), Store: postgres.Name, Run: "run-" + key,
	}
}

// counts reads the rows one key left in the three tables.
func (e env) counts(t *testing.T, tenant, key string) (charges, events, keys int) {
	t.Helper()
	err := e.pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM charges WHERE tenant_id = $1 AND idempotency_key = $2),
		       (SELECT count(*) FROM outbox o JOIN charges c ON c.id = o.charge_id WHERE c.tenant_id = $1 AND c.idempotency_key = $2),
		       (SELECT count(*) FROM idempotency_requests WHERE tenant_id = $1 AND idempotency_key = $2)`, tenant, key).
		Scan(&charges, &events, &keys)
	if err != nil {
		t.Fatal(err)
	}
	return
}

func TestTwoPoolsRaceOnOneKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	replicas := []*postgres.Store{newStore(t, postgres.Config{Pool: pgdb.NewPool(openPool(t, e.url, e.schema, false)), AppName: "lab-test-" + e.schema}), newStore(t, postgres.Config{Pool: pgdb.NewPool(openPool(t, e.url, e.schema, false)), AppName: "lab-test-" + e.schema})}
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	for i := range 50 {
		wg.Go(func() {
			out, err := replicas[i%2].Charge(context.Background(), attempt("acme", "race", 2500, ""))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, lab.ErrInProgress):
				outcomes["in_progress"]++
			case err != nil:
				t.Errorf("attempt %d: %v", i, err)
			case out.Replayed:
				outcomes["replayed"]++
			default:
				outcomes["charged"]++
			}
		})
	}
	wg.Wait()
	if outcomes["charged"] != 1 {
		t.Fatalf("outcomes %v, want exactly one charge", outcomes)
	}
	if c, ev, k := e.counts(t, "acme", "race"); c != 1 || ev != 1 || k != 1 {
		t.Fatalf("rows: %d charges, %d events, %d keys; want 1 each", c, ev, k)
	}
}

func TestOutboxFailureRollsBackEverything(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := newStore(t, postgres.Config{Pool: pgdb.NewPool(e.pool), AppName: "lab-test-" + e.schema})
	a := attempt("acme", "fail", 800, "")
	a.Faults = lab.Faults{Point: lab.FaultOutboxFail}
	if _, err := s.Charge(context.Background(), a); !errors.Is(err, lab.ErrOutboxWrite) {
		t.Fatalf("got %v, want the injected outbox failure", err)
	}
	if c, ev, k := e.counts(t, "acme", "fail"); c != 0 || ev != 0 || k != 0 {
		t.Fatalf("after rollback: %d charges, %d events, %d keys; want none", c, ev, k)
	}
	out, err := s.Charge(context.Background(), attempt("acme", "fail", 800, ""))
	if err != nil || out.Replayed {
		t.Fatalf("retry: %v replayed=%v", err, out.Replayed)
	}
	if c, ev, k := e.counts(t, "acme", "fail"); c != 1 || ev != 1 || k != 1 {
		t.Fatalf("after retry: %d charges, %d events, %d keys; want 1 each", c, ev, k)
	}
}

func TestCrashAfterClaimRollsBack(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := newStore(t, postgres.Config{Pool: pgdb.NewPool(e.pool), AppName: "lab-test-" + e.schema})
	a := attempt("acme", "crash", 800, "")
	a.Faults = lab.Faults{Point: lab.FaultCrashAfterClaim}
	if _, err := s.Charge(context.Background(), a); !errors.Is(err, lab.ErrCrash) {
		t.Fatalf("got %v", err)
	}
	if c, _, k := e.counts(t, "acme", "crash"); c != 0 || k != 0 {
		t.Fatalf("crash left %d charges, %d keys", c, k)
	}
	if out, err := s.Charge(context.Background(), attempt("acme", "crash", 800, "")); err != nil || out.Replayed {
		t.Fatalf("retry: %v", err)
	}
	if c, _, _ := e.counts(t, "acme", "crash"); c != 1 {
		t.Fatalf("charges %d, want 1", c)
	}
}

func TestKeySurvivesRestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	first, err := newStore(t, postgres.Config{Pool: pgdb.NewPool(e.pool), AppName: "lab-test-" + e.schema}).Charge(context.Background(), attempt("acme", "durable", 1200, ""))
	if err != nil {
		t.Fatal(err)
	}
	// A new process: new pool, same database.
	again, err := newStore(t, postgres.Config{Pool: pgdb.NewPool(openPool(t, e.url, e.schema, true)), AppName: "lab-test-" + e.schema}).Charge(context.Background(), attempt("acme", "durable", 1200, ""))
	if err != nil || !again.Replayed || string(again.Response.Body) != string(first.Response.Body) {
		t.Fatalf("after restart: %v replayed=%v body=%s", err, again.Replayed, again.Response.Body)
	}
}

func TestRestartKillsSessionsButKeepsRows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := newStore(t, postgres.Config{Pool: pgdb.NewPool(openPool(t, e.url, e.schema, false)), AppName: "lab-test-" + e.schema})
	if _, err := s.Charge(context.Background(), attempt("acme", "restart", 1200, "")); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(context.Background(), lab.Region{}); err != nil {
		t.Fatal(err)
	}
	out, err := s.Charge(context.Background(), attempt("acme", "restart", 1200, ""))
	if err != nil || !out.Replayed {
		t.Fatalf("after killed sessions: %v replayed=%v", err, out.Replayed)
	}
}

func TestExpiryAndSweeper(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s := newStore(t, postgres.Config{Pool: pgdb.NewPool(e.pool), AppName: "lab-test-" + e.schema, Now: clock})
	ctx := context.Background()
	short := func(key, order string) lab.Attempt {
		a := attempt("acme", key, 500, order)
		a.Faults.Retention = 100 * time.Millisecond
		return a
	}
	for i := range 5 {
		if _, err := s.Charge(ctx, short(fmt.Sprint("sweep-", i), "")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Charge(ctx, short("with-order", "order-77")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Charge(ctx, attempt("acme", "kept", 500, "")); err != nil { // default 24 h window
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(200 * time.Millisecond) // past the short window, on the store's clock
	mu.Unlock()

	// A retry after expiry is a new operation, unless the order id forbids it.
	late, err := s.Charge(ctx, short("with-order", "order-77"))
	if err != nil || late.Replayed || late.Response.Status != 409 {
		t.Fatalf("late retry with order id: %v %d %s", err, late.Response.Status, late.Response.Body)
	}
	if c, _, _ := e.counts(t, "acme", "with-order"); c != 1 {
		t.Fatalf("order charged %d times", c)
	}
	n, err := s.Sweep(ctx)
	if err != nil || n != 5 {
		t.Fatalf("swept %d (%v), want the 5 expired keys", n, err)
	}
	if _, total, _ := s.Keys(ctx, "", 10); total != 2 {
		t.Fatalf("%d keys left, want the live one and the order's fresh one", total)
	}
}

// BenchmarkChargeFreshKeys measures the whole transaction for a new key:
// claim, charge, balance, outbox event, stored response, commit.
func BenchmarkChargeFreshKeys(b *testing.B) {
	e := setup(b)
	s := newStore(b, postgres.Config{Pool: pgdb.NewPool(e.pool), AppName: "lab-test-" + e.schema})
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Charge(ctx, attempt("acme", fmt.Sprint("fresh-", i), 100, "")); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChargeReplay measures a retry answered from the stored response.
func BenchmarkChargeReplay(b *testing.B) {
	e := setup(b)
	s := newStore(b, postgres.Config{Pool: pgdb.NewPool(e.pool), AppName: "lab-test-" + e.schema})
	ctx := context.Background()
	if _, err := s.Charge(ctx, attempt("acme", "replayed", 100, "")); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if out, err := s.Charge(ctx, attempt("acme", "replayed", 100, "")); err != nil || !out.Replayed {
			b.Fatal(err)
		}
	}
}

func TestBalanceTableAgreesWithLedger(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := newStore(t, postgres.Config{Pool: pgdb.NewPool(e.pool), AppName: "lab-test-" + e.schema})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if _, err := s.Charge(context.Background(), attempt("acme", fmt.Sprint("bal-", i), int64(100+i), "")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var table, ledger int64
	if err := e.pool.QueryRow(context.Background(), `SELECT balance_cents FROM account_balances WHERE tenant_id = 'acme' AND account = 'acct-1'`).Scan(&table); err != nil {
		t.Fatal(err)
	}
	ledger, err := e.books.Balance(context.Background(), "acme", "acct-1")
	if err != nil {
		t.Fatal(err)
	}
	if table != ledger || ledger != 20*100+190 {
		t.Fatalf("balances table %d, ledger %d, want %d", table, ledger, 20*100+190)
	}
}

// TestReplicasMigrateTogether starts several pools on a new schema at once:
// the advisory lock lets them all apply the schema without a race.
func TestReplicasMigrateTogether(t *testing.T) {
	t.Parallel()
	url, schema := labtest.Postgres(t)
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			pool, err := pgdb.Open(context.Background(), pgdb.PoolConfig{URL: url, Schema: schema, Size: 4, Migrate: true})
			if err != nil {
				t.Error(err)
				return
			}
			pool.Close()
		})
	}
	wg.Wait()
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(labtest.WithServices(m)) }

// TestReplayDoesNotLockTheKey: replays read the committed row without
// locking it, so they never queue behind each other (or behind anything
// else holding the row) and never turn into a spurious 409.
func TestReplayDoesNotLockTheKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := newStore(t, postgres.Config{Pool: pgdb.NewPool(e.pool), Wait: 200 * time.Millisecond})
	ctx := context.Background()
	if _, err := s.Charge(ctx, attempt("acme", "hot", 100, "")); err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM idempotency_requests WHERE idempotency_key = 'hot' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	out, err := s.Charge(ctx, attempt("acme", "hot", 100, ""))
	if err != nil || !out.Replayed {
		t.Fatalf("replay while the row is locked: %v replayed=%v", err, out.Replayed)
	}
}

// TestWaitIsBoundedByThePool: when every connection is taken the attempt
// gives up after the bounded wait instead of queueing without end.
func TestWaitIsBoundedByThePool(t *testing.T) {
	t.Parallel()
	url, schema := labtest.Postgres(t)
	pool, err := pgdb.Open(context.Background(), pgdb.PoolConfig{URL: url, Schema: schema, Migrate: true, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s := newStore(t, postgres.Config{Pool: pgdb.NewPool(pool), Wait: 200 * time.Millisecond})
	held, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	_, err = s.Charge(context.Background(), attempt("acme", "starved", 100, ""))
	if !errors.Is(err, lab.ErrStoreUnavailable) {
		t.Fatalf("got %v, want store unavailable after the bounded wait", err)
	}
}

// TestApplyIsIdempotentByChargeID: applying the same charge twice (a retry
// after a lost COMMIT answer) returns the recorded charge and adds nothing.
func TestApplyIsIdempotentByChargeID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	entry := lab.NewEntry(attempt("acme", "k-twice", 700, ""), time.Now())
	first, err := e.books.Apply(ctx, lab.Apply{Entry: entry, Event: lab.NewReceiptEvent(entry, lab.Faults{})})
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.books.Apply(ctx, lab.Apply{Entry: entry, Event: lab.NewReceiptEvent(entry, lab.Faults{})})
	if err != nil || again.ID != first.ID || again.BalanceCents != first.BalanceCents {
		t.Fatalf("second apply: %+v %v, want %+v", again, err, first)
	}
	if c, ev, _ := e.counts(t, "acme", "k-twice"); c != 1 || ev != 1 {
		t.Fatalf("%d charges, %d events; want 1 and 1", c, ev)
	}
}

// TestReusedKeyWritesNothing: the same key with another amount is refused
// and leaves the key row, the ledger and the outbox as they were.
func TestReusedKeyWritesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := newStore(t, postgres.Config{Pool: pgdb.NewPool(e.pool), AppName: "lab-test-" + e.schema})
	ctx := context.Background()
	if _, err := s.Charge(ctx, attempt("acme", "k-reuse", 2500, "")); err != nil {
		t.Fatal(err)
	}
	keyRow := func() (fp string, created time.Time) {
		t.Helper()
		if err := e.pool.QueryRow(ctx, `SELECT request_fingerprint, created_at FROM idempotency_requests WHERE idempotency_key = 'k-reuse'`).Scan(&fp, &created); err != nil {
			t.Fatal(err)
		}
		return fp, created
	}
	fp, created := keyRow()
	if _, err := s.Charge(ctx, attempt("acme", "k-reuse", 9999, "")); !errors.Is(err, lab.ErrKeyReused) {
		t.Fatalf("got %v, want key reused", err)
	}
	if c, ev, k := e.counts(t, "acme", "k-reuse"); c != 1 || ev != 1 || k != 1 {
		t.Fatalf("rows: %d charges, %d events, %d keys; want 1 each", c, ev, k)
	}
	if fp2, created2 := keyRow(); fp2 != fp || !created2.Equal(created) {
		t.Fatal("the refused request rewrote the key row")
	}
}
