package postgres

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// TestFastReplayNeverAnswersWhatTheTransactionWouldNot puts every kind of
// key row in the table (state, fingerprint, expiry, stored status) and asks
// both paths: the one-statement replay answers exactly when the row is
// completed, unexpired, of the same request and has a response, and then
// with the very status and bytes the transaction replays. Every other row
// is left to the transaction.
func TestFastReplayNeverAnswersWhatTheTransactionWouldNot(t *testing.T) {
	t.Parallel()
	url, schema := labtest.Postgres(t)
	ctx := context.Background()
	pool, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: url, Schema: schema, Size: 8, Migrate: true, AppName: "lab-test-" + schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	s, err := New(Config{Table: DefaultTable, Pool: pool, Window: time.Hour, Wait: 200 * time.Millisecond, AppName: "lab-test-" + schema, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: 2500, Currency: "USD"}
	other := lab.ChargeRequest{Account: "acct-1", AmountCents: 2600, Currency: "USD"}
	i := 0
	for _, state := range []string{"absent", lab.KeyCompleted, lab.KeyInFlight} {
		for _, sameRequest := range []bool{true, false} {
			for _, expired := range []bool{false, true} {
				for _, status := range []int{0, 201, 409} {
					i++
					key := fmt.Sprintf("k-fast-%d", i)
					a := lab.Attempt{Scope: lab.Scope{Tenant: "acme", Endpoint: lab.Endpoint, Key: key}, Request: req, Fingerprint: req.Fingerprint(), Store: Name}
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
					slow, err := s.charge(ctx, a)
					if hit && (err != nil || !slow.Replayed || slow.Response.Status != fast.Response.Status || !bytes.Equal(slow.Response.Body, fast.Response.Body)) {
						t.Errorf("%s: the fast path replayed %d %s, the transaction answers %+v %v", name, fast.Response.Status, fast.Response.Body, slow, err)
					}
				}
			}
		}
	}
}
