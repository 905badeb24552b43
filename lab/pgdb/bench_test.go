package pgdb_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/reconcile"
	"github.com/idempotency-lab/lab/lab/relay"
	"github.com/idempotency-lab/lab/variants/postgres"
)

// BenchmarkWithAMillionDelivered measures what the lab reads on every
// /outbox, /idempotency/state, reconcile and relay claim, in a namespace
// whose outbox holds 10,000 then 1,000,000 delivered events older than the
// retention (each with its charge, its key, its captures on both sides and
// its webhook event), before and after pruning them. What each lists is
// the same at both sizes: a page of keys, 1,000 charges and captures, a
// batch of 50 due events out of 100 pending, the counts; its cost should
// be too. Filling the million takes a minute or two; it needs PostgreSQL.
//
//	go test -run '^$' -bench WithAMillionDelivered -benchtime 200x ./lab/pgdb/
func BenchmarkWithAMillionDelivered(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			f := fill(b, n)
			f.measure(b, "before")
			start := time.Now()
			pruned := 0
			for _, prune := range []func(context.Context, time.Time, int) (int, error){f.books.PruneDelivered, f.books.PruneWebhookEvents} {
				for {
					k, err := prune(b.Context(), f.clock.Now().Add(-24*time.Hour), 1000)
					if err != nil {
						b.Fatal(err)
					}
					if pruned += k; k < 1000 {
						break
					}
				}
			}
			b.Logf("pruned %d rows (delivered events and webhook ids) in %s, 1,000 per statement", pruned, time.Since(start).Round(time.Millisecond))
			f.vacuum(b) // what autovacuum does after a prune this large
			f.measure(b, "after")
		})
	}
}

// filled is one namespace's books at one size.
type filled struct {
	pool    *pgxpool.Pool
	clock   *labtest.Clock
	books   *pgdb.Books
	records *pgdb.ProviderRecords
	keys    *postgres.Store
}

// fill makes a schema whose acme namespace holds n charges over 1,000
// accounts, two days old, each with its key, its delivered event, its
// capture as both sides recorded it and its webhook event; and, younger,
// 1,000 delivered charges, 100 pending and 10 dead.
func fill(b *testing.B, n int) *filled {
	b.Helper()
	url, schema := labtest.Postgres(b)
	ctx := b.Context()
	pool, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: url, Schema: schema, Size: 4, AppName: "bench-million", Migrate: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	now := time.Now().UTC().Truncate(time.Second)
	clock := labtest.NewClock(now)
	entry := lab.Entry{ChargeID: "ch_x", Namespace: "acme", Tenant: "acme", Account: "acct-1", AmountCents: 100, Currency: "USD", CreatedAt: now}
	payload := string(lab.NewReceiptEvent(entry, lab.Faults{}).Payload) // an event's real size
	start := time.Now()
	old := now.Add(-48 * time.Hour) // the old rows begin then, each 100µs after the one before
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO charges (id, tenant_id, account, amount_cents, currency, idempotency_key, store, created_at, payment_state)
		 SELECT 'ch_' || i, 'acme', 'acct-' || i % 1000, 100, 'USD', 'k-' || i, 'postgres',
		        CASE WHEN i <= $2 THEN $1::timestamptz + i * interval '100 microseconds' ELSE $3 END,
		        CASE WHEN i <= $2 THEN 'succeeded' ELSE 'pending' END
		 FROM generate_series(1, $2 + 1110) i`, []any{old, n, now}},
		{`INSERT INTO outbox (event_id, event_type, charge_id, tenant_id, payload, state, attempts, next_attempt_at, created_at, delivered_at)
		 SELECT gen_random_uuid(), 'payment_receipt_email', 'ch_' || i, 'acme', $3::jsonb, 'delivered', 1, t, t, t + interval '1 second'
		 FROM generate_series(1, $2) i, LATERAL (SELECT $1::timestamptz + i * interval '100 microseconds' AS t) x`, []any{old, n, payload}},
		{`INSERT INTO idempotency_requests (tenant_id, endpoint, idempotency_key, request_fingerprint, state, response_status, response_body, created_at, expires_at)
		 SELECT 'acme', 'POST /charges', 'k-' || i, 'fp', 'completed', 201, '{}'::bytea, t, t + interval '3 days'
		 FROM generate_series(1, $2) i, LATERAL (SELECT $1::timestamptz + i * interval '100 microseconds' AS t) x`, []any{old, n}},
		{`INSERT INTO provider_captures (tenant_id, idempotency_key, capture_id, charge_id, amount_cents, currency, via, status, fingerprint, created_at)
		 SELECT 'acme', 'ch_' || i || ':capture', 'cap_' || i, 'ch_' || i, 100, 'USD', 'outbox', 'succeeded', 'fp', t + interval '500 milliseconds'
		 FROM generate_series(1, $2) i, LATERAL (SELECT $1::timestamptz + i * interval '100 microseconds' AS t) x`, []any{old, n}},
		{`INSERT INTO charge_captures (charge_id, capture_id, tenant_id, recorded_at, settled)
		 SELECT 'ch_' || i, 'cap_' || i, 'acme', t + interval '600 milliseconds', true
		 FROM generate_series(1, $2) i, LATERAL (SELECT $1::timestamptz + i * interval '100 microseconds' AS t) x`, []any{old, n}},
		{`INSERT INTO webhook_events (event_id, event_type, charge_id, tenant_id, state_before, state_after, received_at, capture_id, amount_cents, currency)
		 SELECT 'evt_' || i, 'capture.succeeded', 'ch_' || i, 'acme', 'pending', 'succeeded', t + interval '1 second', 'cap_' || i, 100, 'USD'
		 FROM generate_series(1, $2) i, LATERAL (SELECT $1::timestamptz + i * interval '100 microseconds' AS t) x`, []any{old, n}},
		// The young ones, charged now: 1,000 delivered, 100 pending, 10 dead.
		{`INSERT INTO outbox (event_id, event_type, charge_id, tenant_id, payload, state, attempts, next_attempt_at, created_at, delivered_at)
		 SELECT gen_random_uuid(), 'payment_receipt_email', 'ch_' || i, 'acme', $2::jsonb,
		        CASE WHEN i <= $1 + 1000 THEN 'delivered' WHEN i <= $1 + 1100 THEN 'pending' ELSE 'dead' END,
		        1, $3, $3, CASE WHEN i <= $1 + 1000 THEN $3::timestamptz END
		 FROM generate_series($1 + 1, $1 + 1110) i`, []any{n, payload, now}},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
			b.Fatalf("filling: %v\n%s", err, q.sql)
		}
	}
	f := &filled{pool: pool, clock: clock, books: pgdb.NewBooks(pool, clock.Now), records: pgdb.NewProviderRecords(pool)}
	f.vacuum(b)
	b.Logf("filled %d charges, each with its key, delivered event, captures and webhook event, in %s", n, time.Since(start).Round(time.Millisecond))
	if f.keys, err = postgres.New(postgres.Config{Table: postgres.DefaultTable, Pool: pgdb.NewPool(pool), Window: 24 * time.Hour, Wait: time.Second,
		AppName: "bench-million", Now: clock.Now}); err != nil {
		b.Fatal(err)
	}
	return f
}

// vacuum sets the visibility map and the planner's statistics, as
// autovacuum would after a load or a prune this large.
func (f *filled) vacuum(b *testing.B) {
	b.Helper()
	for _, t := range []string{"charges", "outbox", "outbox_rollup", "idempotency_requests", "provider_captures", "charge_captures", "webhook_events"} {
		if _, err := f.pool.Exec(b.Context(), "VACUUM ANALYZE "+t); err != nil {
			b.Fatal(err)
		}
	}
}

// measure runs each read the lab's routes make, as a sub-benchmark.
func (f *filled) measure(b *testing.B, phase string) {
	ctx := b.Context()
	b.Run(phase+"/OutboxStats", func(b *testing.B) {
		for b.Loop() {
			st, err := f.books.OutboxStats(ctx, "acme")
			if err != nil || st.Pending != 100 || st.Dead != 10 {
				b.Fatalf("%+v %v", st, err)
			}
		}
	})
	b.Run(phase+"/StateListing", func(b *testing.B) {
		for b.Loop() { // GET /idempotency/state: the newest keys and the two tenants' balances
			if keys, _, err := f.keys.Keys(ctx, "acme", 20); err != nil || len(keys) != 20 {
				b.Fatalf("%d keys, %v", len(keys), err)
			}
			for _, tenant := range []string{"acme", "acme~2"} {
				if _, err := f.books.Balance(ctx, tenant, "acct-1"); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run(phase+"/Reconcile", func(b *testing.B) {
		for b.Loop() { // GET /lab/reconcile: the newest 1,000 charges and captures, compared
			ps, err := f.books.Payments(ctx, "acme", "", 1000)
			if err != nil {
				b.Fatal(err)
			}
			cs, err := f.records.Captures(ctx, provider.Filter{Namespace: "acme", Limit: 1000})
			if err != nil {
				b.Fatal(err)
			}
			reconcile.CompareWithin(ps, cs, len(ps) == 1000, len(cs) == 1000, reconcile.Bounds{Now: f.clock.Now(), StuckAfter: 2 * time.Minute})
		}
	})
	b.Run(phase+"/Claim", func(b *testing.B) {
		s := relay.Defaults().Settings
		for b.Loop() { // one relay worker's claim of a batch of due events; the lease then runs out
			evs, err := f.books.ClaimDue(ctx, s.Batch, s.Lease)
			if err != nil || len(evs) != s.Batch {
				b.Fatalf("claimed %d, %v", len(evs), err)
			}
			f.clock.Advance(s.Lease + time.Second)
		}
	})
}
