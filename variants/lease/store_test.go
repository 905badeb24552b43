package lease_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/variants/lease"
)

// setup opens a lease store on a schema of its own, on the given clock:
// leases begin and end by it.
func setup(t *testing.T, now lab.Clock) (*lease.Store, *pgxpool.Pool) {
	t.Helper()
	return setupWait(t, now, 100*time.Millisecond)
}

// setupWait is setup with a twin's bounded wait of its own.
func setupWait(t *testing.T, now lab.Clock, wait time.Duration) (*lease.Store, *pgxpool.Pool) {
	t.Helper()
	url, schema := labtest.Postgres(t)
	pool, err := pgdb.Open(t.Context(), pgdb.PoolConfig{URL: url, Schema: schema, Size: 10, Migrate: true, AppName: "lab-test-" + schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := lease.New(lease.Config{Pool: pgdb.NewPool(pool), Window: time.Hour, Wait: wait, Lease: time.Minute,
		Now: now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s, pool
}

func attempt(key string, f lab.Faults) lab.Attempt {
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: 2500, Currency: "USD"}
	return lab.Attempt{Scope: lab.Scope{Namespace: "acme", Tenant: "acme", Endpoint: lab.Endpoint, Key: key}, Request: req,
		Fingerprint: req.Fingerprint(), Store: lease.Name, Run: "run-fence", Faults: f}
}

// TestStaleWorkerIsFencedByTheLedger: the first worker pauses past its
// lease; a retry takes over with the next token and charges; when the first
// wakes, the database refuses its write (its token is stale), it is
// recorded, and the ledger holds exactly one charge, carrying the new token.
func TestStaleWorkerIsFencedByTheLedger(t *testing.T) {
	clock := labtest.NewClock(time.Now())
	s, pool := setup(t, clock.Now)
	signals := lease.ArmSignals(s)
	ctx := t.Context()
	const key = "k-stale"
	owner := attempt(key, lab.Faults{Point: lab.FaultStaleWorker, Work: time.Second, ClaimTTL: 200 * time.Millisecond})
	done := labtest.ChargeAsync(ctx, s, owner)
	// The claim is committed (visible while the work runs), then its lease
	// ends: the paused worker renews nothing.
	claimedToken := signals.WaitClaimed(t)
	if k, err := s.Lookup(ctx, owner.Scope); err != nil || k.State != lab.KeyInFlight {
		t.Fatalf("key %s once claimed: %+v (%v); want it in flight", key, k, err)
	}
	clock.Advance(300 * time.Millisecond)
	if k, err := s.Lookup(ctx, owner.Scope); err != nil || k.State != lab.KeyAbsent {
		t.Fatalf("key %s after its lease: %+v (%v); want it free to take over", key, k, err)
	}
	op, err := s.Operation(ctx, owner.Scope)
	if err != nil || op.Token != claimedToken || op.State != lab.KeyInFlight {
		t.Fatalf("the paused worker's operation %+v (%v): want its token %d, in flight", op, err, claimedToken)
	}
	staleToken := op.Token
	retry := attempt(key, lab.Faults{})
	taken, err := s.Charge(ctx, retry)
	if err != nil || taken.Replayed || taken.Response.Status != http.StatusCreated {
		t.Fatalf("the retry after the lease ended: %+v %v; want a fresh 201", taken, err)
	}
	if op, _ = s.Operation(ctx, retry.Scope); op.Token <= staleToken || op.State != lab.KeyCompleted {
		t.Fatalf("after the take-over: %+v; want a token above %d, completed", op, staleToken)
	}
	stale := <-done
	if stale.Err != nil || !stale.Out.Replayed || string(stale.Out.Response.Body) != string(taken.Response.Body) {
		t.Fatalf("the stale worker: %+v %v; want the take-over's charge replayed to it", stale.Out, stale.Err)
	}

	// What the database holds, asked directly.
	var charges int
	var token int64
	if err := pool.QueryRow(ctx, `SELECT count(*), max(fence_token) FROM charges WHERE tenant_id = 'acme' AND idempotency_key = $1`, key).Scan(&charges, &token); err != nil {
		t.Fatal(err)
	}
	if charges != 1 || token != op.Token {
		t.Fatalf("ledger: %d charge(s), token %d; want exactly one, written with the take-over's token %d", charges, token, op.Token)
	}
	var refused int64
	if err := pool.QueryRow(ctx, `SELECT stale_token FROM fenced_writes WHERE tenant_id = 'acme' AND idempotency_key = $1`, key).Scan(&refused); err != nil || refused != staleToken {
		t.Fatalf("fenced_writes: token %d (%v); want the stale token %d recorded", refused, err, staleToken)
	}
	// The fence is the resource's: a write carrying token 1 is refused by
	// the database itself, whoever sends it.
	_, err = pool.Exec(ctx, `INSERT INTO charges (id, tenant_id, account, amount_cents, currency, idempotency_key, store, created_at, fence_token)
		VALUES ('ch_direct_stale', 'acme', 'acct-1', 2500, 'USD', $1, 'lease', now(), $2)`, key, staleToken)
	if !pgdb.StaleToken(err) {
		t.Fatalf("a direct insert with the stale token: %v; want SQLSTATE LF001", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO charges (id, tenant_id, account, amount_cents, currency, idempotency_key, store, created_at, fence_token)
		VALUES ('ch_direct_unknown', 'acme', 'acct-1', 2500, 'USD', 'k-no-claim', 'lease', now(), 1)`); !pgdb.StaleToken(err) {
		t.Fatalf("a direct insert with a token of no claim: %v; want SQLSTATE LF001", err)
	}
}

// TestLongWorkAnswers202: while the owner works under a live lease a twin
// gets the operation (202), and once done the final response.
func TestLongWorkAnswers202(t *testing.T) {
	s, _ := setup(t, time.Now)
	signals := lease.ArmSignals(s)
	ctx := t.Context()
	owner := attempt("k-long", lab.Faults{Point: lab.FaultSlow, Work: time.Second})
	done := make(chan lab.Outcome, 1)
	go func() {
		out, err := s.Charge(context.WithoutCancel(ctx), owner)
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	signals.WaitClaimed(t) // the owner's claim is committed; its work takes a second
	twin, err := s.Charge(ctx, attempt("k-long", lab.Faults{}))
	if err != nil || twin.Pending == nil {
		t.Fatalf("a twin during the work got %+v (%v); want 202 with the operation", twin, err)
	}
	pending := twin.Pending
	if pending.Token < 1 || pending.State != lab.KeyInFlight || !pending.LeaseExpires.After(time.Now()) {
		t.Fatalf("pending operation %+v: want a token, in flight with a live lease", pending)
	}
	first := <-done
	again, err := s.Charge(ctx, attempt("k-long", lab.Faults{}))
	if err != nil || !again.Replayed || string(again.Response.Body) != string(first.Response.Body) {
		t.Fatalf("after the work: %+v %v; want the replay", again, err)
	}
	op, err := s.Operation(ctx, owner.Scope)
	if err != nil || op.State != lab.KeyCompleted || op.Status != http.StatusCreated || string(op.Body) != string(first.Response.Body) {
		t.Fatalf("operation %+v (%v): want completed with the 201", op, err)
	}
}

// TestTakeOverLosesToACompletion: a retry that read "lease over" and a
// paused holder that woke both want the key row; the holder, its token
// still current, gets it first and completes. The retry's take-over then
// re-checks the row as it is, finds it completed, and replays: one charge.
// An outside lock on the row orders the two waiters, and PostgreSQL's own
// lock table says when each is waiting.
func TestTakeOverLosesToACompletion(t *testing.T) {
	clock := labtest.NewClock(time.Now())
	s, pool := setup(t, clock.Now)
	signals := lease.ArmSignals(s)
	ctx := t.Context()
	const key = "k-completed-meanwhile"
	owner := attempt(key, lab.Faults{Point: lab.FaultStaleWorker, Work: time.Second, ClaimTTL: 100 * time.Millisecond})
	done := make(chan error, 1)
	go func() { _, err := s.Charge(ctx, owner); done <- err }()
	signals.WaitClaimed(t)
	clock.Advance(200 * time.Millisecond) // the holder's lease is over; it wakes a second after its claim
	if op, err := s.Operation(ctx, owner.Scope); err != nil || op.State != lab.KeyInFlight || op.LeaseExpires.After(clock.Now()) {
		t.Fatalf("the holder's operation %+v (%v): want it in flight, its lease over", op, err)
	}
	// waitFor reads PostgreSQL's lock table until it shows what it waits
	// for: a session blocked on a row lock is inside PostgreSQL, where no
	// code of the store runs to signal it.
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		labtest.Eventually(t, what, ok)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM lease_requests WHERE idempotency_key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	waiting := func() int {
		var n int
		// This test's sessions only (its pool's application_name), waiting
		// on a lock: the holder's fenced INSERT, the retry's take-over.
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND application_name = current_setting('application_name')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor("the woken holder waiting on the key row", func() bool { return waiting() >= 1 })
	retried := labtest.ChargeAsync(ctx, s, attempt(key, lab.Faults{}))
	waitFor("the retry's take-over waiting behind it", func() bool { return waiting() >= 2 })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the holder: %v", err)
	}
	r := <-retried
	if r.Err != nil || !r.Out.Replayed {
		t.Fatalf("the retry: %+v %v; want a replay of the holder's charge", r.Out, r.Err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE idempotency_key = $1`, key).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the ledger holds %d charge(s) (%v), want 1", n, err)
	}
}

// TestHungUpClientReleasesItsClaim: a client that hangs up while its
// attempt works (its request's context ends) gives the claim back before
// any write, so its retry charges at once instead of waiting out the
// minute-long lease, and the ledger holds the retry's one charge.
func TestHungUpClientReleasesItsClaim(t *testing.T) {
	s, pool := setup(t, time.Now)
	signals := lease.ArmSignals(s)
	const key = "k-hung-up"
	reqCtx, hangUp := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := s.Charge(reqCtx, attempt(key, lab.Faults{Point: lab.FaultSlow, Work: time.Minute}))
		done <- err
	}()
	signals.WaitClaimed(t)
	hangUp()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the hung-up attempt: %v; want its context's end", err)
	}
	retry, err := s.Charge(t.Context(), attempt(key, lab.Faults{}))
	if err != nil || retry.Replayed || retry.Pending != nil || retry.Response.Status != http.StatusCreated {
		t.Fatalf("the retry after the hang-up: %+v %v; want a fresh 201 at once, not the lease's wait", retry, err)
	}
	var charges int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM charges WHERE tenant_id = 'acme' AND idempotency_key = $1`, key).Scan(&charges); err != nil || charges != 1 {
		t.Fatalf("ledger: %d charge(s) (%v); want the retry's one", charges, err)
	}
}
