package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants/conformance"
	"github.com/idempotency-lab/lab/variants/postgres"
)

// TestConformancePlain holds the step-by-step path alone (-plain-paths on)
// to the whole conformance suite, as TestConformance does the optimised one.
func TestConformancePlain(t *testing.T) {
	v := postgres.Variant()
	open := v.Open
	v.Open = func(ctx context.Context, d variant.Deps) (lab.Store, error) {
		d.Plain = true
		return open(ctx, d)
	}
	conformance.Exercise(t, v)
}

// requestCounter counts what a pool sends the server: each statement, and
// each batch once (it goes in one round trip).
type requestCounter struct{ n atomic.Int64 }

func (c *requestCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *requestCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *requestCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *requestCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *requestCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// step is one attempt of the script both paths run.
type step struct {
	tenant, key string
	amount      int64
	order       string
	chargeID    string
	faults      lab.Faults
	advance     time.Duration // the clock moves this much before the attempt
}

// TestPlainAndOptimisedAgree runs one script of attempts (first charges,
// replays, a reused key, a repeated order, both crashes, the outbox
// failure, expired keys with and without a domain key, a repeated charge
// id, two tenants) on the plain path and on the optimised one, each on a
// schema of its own with the same frozen clock and charge ids: every
// answer is the same to the byte, and so are the ledger, the outbox, the
// balances and the key rows they leave. The optimised path must also have
// sent fewer requests for a first charge, and one for a replay: the test
// compares two paths, not one with itself.
func TestPlainAndOptimisedAgree(t *testing.T) {
	t.Parallel()
	short := lab.Faults{Point: lab.FaultExpired, Retention: time.Second}
	script := []step{
		{tenant: "acme", key: "k-first", amount: 2500},
		{tenant: "acme", key: "k-first", amount: 2500},
		{tenant: "acme", key: "k-first", amount: 2600},
		{tenant: "acme", key: "k-order", amount: 700, order: "order-1"},
		{tenant: "acme", key: "k-order-again", amount: 900, order: "order-1"},
		{tenant: "acme", key: "k-order-again", amount: 900, order: "order-1"},
		{tenant: "globex", key: "k-first", amount: 2500},
		{tenant: "acme", key: "k-crash-claim", amount: 10, faults: lab.Faults{Point: lab.FaultCrashAfterClaim}},
		{tenant: "acme", key: "k-crash-claim", amount: 10},
		{tenant: "acme", key: "k-crash-charge", amount: 20, faults: lab.Faults{Point: lab.FaultCrashAfterCharge}},
		{tenant: "acme", key: "k-crash-charge", amount: 20},
		{tenant: "acme", key: "k-outbox", amount: 30, faults: lab.Faults{Point: lab.FaultOutboxFail}},
		{tenant: "acme", key: "k-outbox", amount: 30},
		{tenant: "acme", key: "k-expired", amount: 40, faults: short},
		{tenant: "acme", key: "k-expired", amount: 40, faults: short, advance: 2 * time.Second},
		{tenant: "acme", key: "k-expired-order", amount: 50, order: "order-2", faults: short},
		{tenant: "acme", key: "k-expired-order", amount: 50, order: "order-2", faults: short, advance: 2 * time.Second},
		{tenant: "acme", key: "k-same-charge", amount: 60, chargeID: "ch_same"},
		{tenant: "acme", key: "k-same-charge-again", amount: 60, chargeID: "ch_same"},
	}
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	plain, plainRequests := runScript(t, true, start, script)
	optimised, optimisedRequests := runScript(t, false, start, script)
	for i := range script {
		if plain.answers[i] != optimised.answers[i] {
			t.Errorf("step %d (%s): plain answered %s, optimised %s", i, script[i].key, plain.answers[i], optimised.answers[i])
		}
	}
	// A first charge and its replay, the cases the optimisations are for
	// (a repeated order or charge id falls back, and costs more).
	if optimisedRequests[0] >= plainRequests[0] {
		t.Errorf("a first charge sent %d requests on the optimised path, %d on the plain one", optimisedRequests[0], plainRequests[0])
	}
	if optimisedRequests[1] != 1 || plainRequests[1] <= 1 {
		t.Errorf("a replay sent %d requests on the optimised path (want 1, its one statement), %d on the plain one", optimisedRequests[1], plainRequests[1])
	}
	t.Logf("requests per step, plain %v, optimised %v", plainRequests, optimisedRequests)
	if plain.tables != optimised.tables {
		t.Errorf("the paths left different rows.\nplain:\n%s\noptimised:\n%s", plain.tables, optimised.tables)
	}
	if !strings.Contains(plain.tables, "charges") || strings.Count(plain.tables, "\n") < 30 {
		t.Fatalf("the script left too little to compare:\n%s", plain.tables)
	}
}

// scriptResult is what one path answered and left behind.
type scriptResult struct {
	answers []string
	tables  string
}

// runScript runs script on a store of its own schema and reports each
// answer, the requests each attempt sent, and every row left.
func runScript(t *testing.T, plain bool, start time.Time, script []step) (scriptResult, []int64) {
	t.Helper()
	e := setup(t)
	clock := labtest.NewClock(start)
	var requests requestCounter
	pc, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = e.schema
	pc.ConnConfig.RuntimeParams["application_name"] = "lab-test-" + e.schema
	pc.ConnConfig.Tracer = &requests
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(t, postgres.Config{Pool: pgdb.NewPool(pool), Window: time.Hour, AppName: "lab-test-" + e.schema, Now: clock.Now, Plain: plain})
	var res scriptResult
	sent := make([]int64, len(script))
	for i, st := range script {
		clock.Advance(st.advance)
		req := lab.ChargeRequest{Account: "acct-1", AmountCents: st.amount, Currency: "USD", OrderID: st.order}
		chargeID := st.chargeID
		if chargeID == "" {
			chargeID = fmt.Sprintf("ch_step_%d", i)
		}
		a := lab.Attempt{
			Scope:   lab.Scope{Namespace: lab.NamespaceOf(st.tenant), Tenant: st.tenant, Endpoint: lab.Endpoint, Key: st.key},
			Request: req, Fingerprint: req.Fingerprint(), Store: postgres.Name, Run: "run-script", Faults: st.faults, ChargeID: chargeID,
		}
		before := requests.n.Load()
		out, err := s.Charge(context.Background(), a)
		sent[i] = requests.n.Load() - before
		res.answers = append(res.answers, answer(out, err))
	}
	res.tables = dump(t, e.pool)
	return res, sent
}

// answer renders an outcome, errors by kind.
func answer(out lab.Outcome, err error) string {
	var ip *lab.InProgressError
	switch {
	case errors.Is(err, lab.ErrKeyReused):
		return "key reused"
	case errors.Is(err, lab.ErrCrash):
		return "crash"
	case errors.Is(err, lab.ErrOutboxWrite):
		return "outbox write failed"
	case errors.As(err, &ip):
		return "in progress"
	case err != nil:
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%d replayed=%v %s", out.Response.Status, out.Replayed, out.Response.Body)
}

// dump renders every row the script could have left, in a stable order;
// outbox event ids are drawn at random, so only their count per charge is
// compared through the rest of each row.
func dump(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{
		`SELECT 'charges', id, tenant_id, account, amount_cents, currency, coalesce(order_id, ''), idempotency_key, balance_after_cents, created_at
		 FROM charges ORDER BY id`,
		`SELECT 'outbox', charge_id, event_type, tenant_id, run_id, payload::text, next_attempt_at, created_at
		 FROM outbox ORDER BY charge_id, payload::text`,
		`SELECT 'balances', tenant_id, account, balance_cents FROM account_balances ORDER BY tenant_id, account`,
		`SELECT 'keys', tenant_id, endpoint, idempotency_key, request_fingerprint, state, coalesce(response_status, 0),
		        coalesce(convert_from(response_body, 'UTF8'), ''), coalesce(resource_id, ''), created_at, expires_at
		 FROM idempotency_requests ORDER BY tenant_id, idempotency_key`,
	} {
		rows, err := pool.Query(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(&b, vals...)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}
