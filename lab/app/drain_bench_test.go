package app_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants/memory"
)

// drainEvents is how many outbox events each iteration of
// BenchmarkRelayDrain leaves for the relay.
const drainEvents = 1000

// BenchmarkRelayDrain fills the outbox of a lab on PostgreSQL (its books
// and its own provider's records) with drainEvents charges while the
// relay is held, then times the relay draining them to settlement: each
// event delivered (its capture made, its receipt sent) and its charge
// paid by the provider's capture.succeeded webhook, applied through
// POST /webhooks/provider. It reports events/s; run it with -benchtime Nx.
func BenchmarkRelayDrain(b *testing.B) {
	url, schema := labtest.Postgres(b)
	cfg := app.DefaultConfig()
	cfg.Variants = []variant.Variant{memory.Variant()}
	cfg.Addr, cfg.DatabaseURL, cfg.PGSchema = "127.0.0.1:0", url, schema
	cfg.EmbedPostgres, cfg.EmbedRedis, cfg.RedisPair = false, false, false
	a := labtest.Start(b, cfg)
	a.HoldDelivery(true)
	// A pool of the benchmark's own reads how far the drain is, so the
	// lab's pools serve the drain alone.
	pool, err := pgdb.Open(b.Context(), pgdb.PoolConfig{URL: url, Schema: schema, Size: 2, AppName: "drain-bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	ctx := b.Context()
	pub := a.Public()
	var settled time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		run := fmt.Sprintf("drain-%d", i)
		fill(b, a.Books(), pub.Namespace, pub.Tenant, run, drainEvents)
		b.StartTimer()
		began := time.Now()
		a.HoldDelivery(false)
		waitSettled(b, ctx, pool, run, drainEvents)
		settled += time.Since(began)
		a.HoldDelivery(true)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*drainEvents)/settled.Seconds(), "events/s")
	// Webhooks the lab refused (a capture not recorded yet, say) are sent
	// again after a backoff: work the drain did twice.
	st, err := a.Provider().Stats(ctx, provider.Filter{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(st.WebhooksRejected)/float64(b.N*drainEvents), "rejected/event")
}

// fill charges n times in the books, each charge with its outbox event,
// as the charge path writes them.
func fill(b *testing.B, books lab.Ledger, ns lab.Namespace, tenant, run string, n int) {
	b.Helper()
	now := time.Now()
	for i := range n {
		at := lab.Attempt{Scope: lab.Scope{Namespace: ns, Tenant: tenant, Endpoint: lab.Endpoint, Key: fmt.Sprintf("%s-%d", run, i)},
			Request: lab.ChargeRequest{Account: "acct-1", AmountCents: 100, Currency: "USD"}, Store: "memory", Run: run}
		e := lab.NewEntry(at, now)
		if _, err := books.Apply(b.Context(), lab.Apply{Entry: e, Event: lab.NewReceiptEvent(e, lab.Faults{})}); err != nil {
			b.Fatal(err)
		}
	}
}

// waitSettled waits until every event of run is delivered and every one
// of its charges paid.
func waitSettled(b *testing.B, ctx context.Context, pool *pgxpool.Pool, run string, n int) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var delivered, paid int
		err := pool.QueryRow(ctx, `
			SELECT (SELECT count(*) FROM outbox WHERE run_id = $1 AND state = 'delivered'),
			       (SELECT count(*) FROM charges WHERE run_id = $1 AND payment_state = $2)`, run, lab.PaymentSucceeded).
			Scan(&delivered, &paid)
		if err != nil {
			b.Fatal(err)
		}
		if delivered == n && paid == n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("run %s: %d of %d delivered, %d paid after 5m", run, delivered, n, paid)
		}
		// Polled, not signalled: the lab's code is unchanged by it, and 10 ms
		// is small beside a drain of a thousand events.
		time.Sleep(10 * time.Millisecond)
	}
}
