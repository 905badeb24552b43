package pgdb_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
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
	// PostgreSQL looks for a deadlock once, deadlock_timeout (1 s) into a
	// wait: a loaded machine that closes the cycle later than that makes
	// the webhook the victim instead. That round proves nothing of the
	// reset's retry, and is played again.
	for round := 1; ; round++ {
		if resetWasTheVictim(t, pool, fmt.Sprintf("dl%d", round)) {
			return
		}
		t.Logf("round %d: the webhook was the victim (the cycle closed after the reset's deadlock check); again", round)
		if round == 5 {
			t.Fatal("in 5 rounds PostgreSQL never made the reset the victim")
		}
	}
}

// resetWasTheVictim plays the deadlock in namespace ns and checks the
// reset emptied it; it reports whether the reset was the victim.
func resetWasTheVictim(t *testing.T, pool *pgxpool.Pool, ns string) bool {
	t.Helper()
	ctx := t.Context()
	tenant, charge, event := ns+"~t", "ch_"+ns, "ev_"+ns
	if _, err := pool.Exec(ctx, `INSERT INTO charges (id, tenant_id, account, amount_cents, currency, store, created_at) VALUES ($1, $2, 'acct', 100, 'EUR', 'postgres', now())`, charge, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_events (event_id, event_type, charge_id, tenant_id, state_before, state_after, received_at) VALUES ($1, 'charge.captured', $2, $3, 'pending', 'captured', now())`, event, charge, tenant); err != nil {
		t.Fatal(err)
	}
	webhook, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer webhook.Rollback(context.WithoutCancel(ctx))
	if _, err := webhook.Exec(ctx, `UPDATE charges SET replica = 'webhook' WHERE id = $1`, charge); err != nil {
		t.Fatal(err)
	}
	reset := make(chan error, 1)
	go func() { reset <- pgdb.NewBooks(pool, nil).Reset(ctx, lab.Namespace(ns)) }()
	// The reset waits on the charge the webhook holds; only PostgreSQL sees it.
	labtest.Eventually(t, "the reset waiting on the webhook's lock", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'reset-test' AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n == 1
	})
	_, err = webhook.Exec(ctx, `DELETE FROM webhook_events WHERE event_id = $1`, event)
	var pe *pgconn.PgError
	resetVictim := err == nil
	switch {
	case errors.As(err, &pe) && pe.Code == "40P01":
		webhook.Rollback(ctx) // its locks go: the reset goes on
	case err != nil:
		t.Fatalf("the webhook's delete: %v", err)
	default:
		if err := webhook.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-reset; err != nil {
		t.Fatalf("reset: %v", err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE tenant_id = $1`, tenant).Scan(&left); err != nil || left != 0 {
		t.Fatalf("charges of the namespace after its reset: %d (%v)", left, err)
	}
	return resetVictim
}
