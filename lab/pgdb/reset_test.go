package pgdb_test

import (
	"context"
	"testing"

	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// TestResetOutlivesADeadlock: a webhook's transaction holds a charge and
// then wants the webhook row a reset of the namespace has already deleted.
// PostgreSQL ends the reset, which waited first, as the deadlock's victim;
// the reset runs again and empties the namespace all the same.
func TestResetOutlivesADeadlock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url, schema := labtest.Postgres(t)
	pool, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: url, Schema: schema, Size: 4, AppName: "reset-test", Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, q := range []string{
		`INSERT INTO charges (id, tenant_id, account, amount_cents, currency, store, created_at) VALUES ('ch_dl', 'dl~t', 'acct', 100, 'EUR', 'postgres', now())`,
		`INSERT INTO webhook_events (event_id, event_type, charge_id, tenant_id, state_before, state_after, received_at) VALUES ('ev_dl', 'charge.captured', 'ch_dl', 'dl~t', 'pending', 'captured', now())`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	webhook, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer webhook.Rollback(context.WithoutCancel(ctx))
	if _, err := webhook.Exec(ctx, `UPDATE charges SET replica = 'webhook' WHERE id = 'ch_dl'`); err != nil {
		t.Fatal(err)
	}
	reset := make(chan error, 1)
	go func() { reset <- pgdb.NewBooks(pool, nil).Reset(ctx, "dl") }()
	// The reset waits on the charge the webhook holds; only PostgreSQL sees it.
	labtest.Eventually(t, "the reset waiting on the webhook's lock", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'reset-test' AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n == 1
	})
	_, err = webhook.Exec(ctx, `DELETE FROM webhook_events WHERE event_id = 'ev_dl'`)
	if err != nil {
		t.Fatalf("the webhook's delete: %v (the reset should be the victim)", err)
	}
	if err := webhook.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-reset; err != nil {
		t.Fatalf("reset: %v", err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE tenant_id = 'dl~t'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("charges of the namespace after its reset: %d (%v)", left, err)
	}
}
