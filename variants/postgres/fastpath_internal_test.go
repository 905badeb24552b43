package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// storeOnOwnSchema returns a store on a schema of its own, with the bounded wait
// and clock given, and its pool.
func storeOnOwnSchema(t *testing.T, wait time.Duration, now lab.Clock) (*Store, *pgxpool.Pool) {
	t.Helper()
	url, schema := labtest.Postgres(t)
	pool, err := pgdb.Open(context.Background(), pgdb.PoolConfig{URL: url, Schema: schema, Size: 8, Migrate: true, AppName: "lab-test-" + schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(Config{Table: DefaultTable, Pool: pgdb.NewPool(pool), Window: time.Hour, Wait: wait, AppName: "lab-test-" + schema, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return s, pool
}

// TestFastReplayNeverAnswersWhatTheTransactionWouldNot puts every kind of
// key row in the table (state, fingerprint, expiry, stored status) and asks
// both paths: the one-statement replay answers exactly when the row is
// completed, unexpired, of the same request and has a response, and then
// with the very status and bytes the transaction replays. Every other row
// is left to the transaction.
func TestFastReplayNeverAnswersWhatTheTransactionWouldNot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	s, pool := storeOnOwnSchema(t, 200*time.Millisecond, func() time.Time { return now })
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: 2500, Currency: "USD"}
	other := lab.ChargeRequest{Account: "acct-1", AmountCents: 2600, Currency: "USD"}
	i := 0
	for _, state := range []string{"absent", lab.KeyCompleted, lab.KeyInFlight} {
		for _, sameRequest := range []bool{true, false} {
			for _, expired := range []bool{false, true} {
				for _, status := range []int{0, 201, 409} {
					i++
					key := fmt.Sprintf("k-fast-%d", i)
					a := lab.Attempt{Scope: lab.Scope{Namespace: "acme", Tenant: "acme", Endpoint: lab.Endpoint, Key: key}, Request: req, Fingerprint: req.Fingerprint(), Store: Name}
					stored := a.Fingerprint
					if !sameRequest {
						stored = other.Fingerprint()
					}
					expires := now.Add(time.Minute)
					if expired {
						expires = now.Add(-time.Second)
					}
					var st *int
					if status != 0 {
						st = &status
					}
					body := []byte(fmt.Sprintf(`{"id":"ch_stored_%d"}`, i))
					if state != "absent" {
						if _, err := pool.Exec(ctx, `INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint, state, response_status, response_body, created_at, expires_at)
							VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, "acme", lab.Endpoint, key, stored, state, st, body, now.Add(-time.Minute), expires); err != nil {
							t.Fatal(err)
						}
					}
					name := fmt.Sprintf("%s same=%v expired=%v status=%d", state, sameRequest, expired, status)
					fast, hit, err := s.replayFast(ctx, a)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					want := state == lab.KeyCompleted && sameRequest && !expired && status != 0
					if hit != want {
						t.Errorf("%s: the fast path answered %v, want %v", name, hit, want)
					}
					slow, err := s.chargeStepByStep(ctx, a)
					if hit && (err != nil || !slow.Replayed || slow.Response.Status != fast.Response.Status || !bytes.Equal(slow.Response.Body, fast.Response.Body)) {
						t.Errorf("%s: the fast path replayed %d %s, the transaction answers %+v %v", name, fast.Response.Status, fast.Response.Body, slow, err)
					}
				}
			}
		}
	}
}

// TestPipelinedChargeAnswersWhatItStores charges one account through the
// one-statement charge and the step-by-step one in turn: each answer is the
// charge the ledger holds, with the balance the ledger recorded, and the
// very bytes the key stored for its replays; each key has one charge and one
// outbox event. An order already charged rolls the pipelined statement back
// whole and leaves the answer to the step-by-step transaction.
func TestPipelinedChargeAnswersWhatItStores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := storeOnOwnSchema(t, 2*time.Second, time.Now)
	attempt := func(key string, req lab.ChargeRequest) lab.Attempt {
		return lab.Attempt{Scope: lab.Scope{Namespace: "acme", Tenant: "acme", Endpoint: lab.Endpoint, Key: key}, Request: req, Fingerprint: req.Fingerprint(), Store: Name, Run: "run-pipelined"}
	}
	var balance int64
	for i, amount := range []int64{2500, 7, 99_999_993, 1, 10_000} {
		pipelined := i%2 == 0
		key := fmt.Sprintf("k-pipelined-%d", i)
		req := lab.ChargeRequest{Account: "acct-10", AmountCents: amount, Currency: "USD", OrderID: fmt.Sprintf("order-%d0%d1", i, i)}
		charge := s.chargeStepByStep
		if pipelined {
			charge = s.tryPipelined
		}
		out, err := charge(ctx, attempt(key, req))
		if err != nil {
			t.Fatalf("charge %d (pipelined %v): %v", i, pipelined, err)
		}
		balance += amount
		var got lab.Charge
		if err := json.Unmarshal(out.Response.Body, &got); err != nil || out.Response.Status != http.StatusCreated {
			t.Fatalf("charge %d answered %d %s (%v)", i, out.Response.Status, out.Response.Body, err)
		}
		var id, order string
		var ledgerAmount, ledgerBalance int64
		var stored []byte
		var events int
		if err := pool.QueryRow(ctx, `
			SELECT c.id, c.amount_cents, c.balance_after_cents, c.order_id, k.response_body,
			       (SELECT count(*) FROM outbox o WHERE o.charge_id = c.id)
			FROM charges c JOIN idempotency_requests k ON k.tenant_id = c.tenant_id AND k.idempotency_key = c.idempotency_key
			WHERE c.idempotency_key = $1`, key).Scan(&id, &ledgerAmount, &ledgerBalance, &order, &stored, &events); err != nil {
			t.Fatalf("charge %d: reading the ledger: %v", i, err)
		}
		switch {
		case got.ID != id || got.AmountCents != ledgerAmount || got.OrderID != order:
			t.Errorf("charge %d answered %+v; the ledger holds %s, %d cents, order %s", i, got, id, ledgerAmount, order)
		case got.BalanceCents != balance || ledgerBalance != balance:
			t.Errorf("charge %d: answered balance %d, ledger %d, want %d", i, got.BalanceCents, ledgerBalance, balance)
		case !bytes.Equal(stored, out.Response.Body):
			t.Errorf("charge %d answered %s but stored %s for its replays", i, out.Response.Body, stored)
		case events != 1:
			t.Errorf("charge %d has %d outbox events, want 1", i, events)
		}
	}

	again := attempt("k-pipelined-order-again", lab.ChargeRequest{Account: "acct-10", AmountCents: 5, Currency: "USD", OrderID: "order-0001"})
	if _, err := s.tryPipelined(ctx, again); !errors.Is(err, errTakeSlowPath) {
		t.Fatalf("an order already charged, pipelined: %v, want the step-by-step path", err)
	}
	var keys, charges int
	var held int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency_requests WHERE idempotency_key = $1),
		(SELECT count(*) FROM charges WHERE account = 'acct-10'), (SELECT balance_cents FROM account_balances WHERE account = 'acct-10')`,
		again.Scope.Key).Scan(&keys, &charges, &held); err != nil {
		t.Fatal(err)
	}
	if keys != 0 || charges != 5 || held != balance {
		t.Fatalf("the rolled-back statement left %d key rows, %d charges, balance %d; want 0, 5, %d", keys, charges, held, balance)
	}
	out, err := s.Charge(ctx, again)
	if err != nil || out.Response.Status != http.StatusConflict || !bytes.Contains(out.Response.Body, []byte("order_already_charged")) {
		t.Fatalf("an order already charged answered %d %s (%v), want 409 order_already_charged", out.Response.Status, out.Response.Body, err)
	}
}

// TestAroundBalanceSplitsAtTheBalance renders charges whose other fields
// are full of digits: the split is where the balance goes, whatever it is.
func TestAroundBalanceSplitsAtTheBalance(t *testing.T) {
	t.Parallel()
	c := lab.Charge{ID: "ch_0101", Account: "10", AmountCents: 1010, Currency: "USD", OrderID: "0", CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 10, time.UTC)}
	before, after, ok := aroundBalance(c)
	if !ok {
		t.Fatal("no split")
	}
	for _, balance := range []int64{0, 1, -5, 1010, 9_223_372_036_854_775_807} {
		c.BalanceCents = balance
		want := lab.ChargeResponse(c).Body
		got := append(strconv.AppendInt(bytes.Clone(before), balance, 10), after...)
		if !bytes.Equal(got, want) {
			t.Errorf("balance %d: %s, want %s", balance, got, want)
		}
	}
}
