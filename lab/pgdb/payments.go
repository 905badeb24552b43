package pgdb

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-lab/lab/lab"
)

// ApplyWebhook processes one verified provider event in one transaction:
// the event id is recorded (its primary key turns a redelivery into a
// duplicate that changes nothing), the charge row is locked, and the state
// machine moves it. An event about a charge the ledger does not hold
// records nothing and returns lab.ErrUnknownCharge, so the provider's retry
// is processed once the charge exists.
func (b *Books) ApplyWebhook(ctx context.Context, w lab.Webhook) (lab.WebhookResult, error) {
	var res lab.WebhookResult
	err := pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		res = lab.WebhookResult{}
		var current string
		err := tx.QueryRow(ctx, `SELECT payment_state FROM charges WHERE id = $1 AND tenant_id = $2 FOR UPDATE`, w.ChargeID, w.Tenant).Scan(&current)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("charge %s: %w", w.ChargeID, lab.ErrUnknownCharge)
		}
		if err != nil {
			return fmt.Errorf("error locking charge %s: %w", w.ChargeID, err)
		}
		next, err := lab.NextPaymentState(current, w.Type)
		if err != nil {
			return err
		}
		// A twin of this event waits here on the primary key until the
		// first commits, then inserts nothing.
		tag, err := tx.Exec(ctx, `
			INSERT INTO webhook_events (event_id, event_type, charge_id, tenant_id, state_before, state_after, received_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (event_id) DO NOTHING`,
			w.EventID, w.Type, w.ChargeID, w.Tenant, current, next, w.ReceivedAt)
		if err != nil {
			return fmt.Errorf("error recording webhook %s: %w", w.EventID, err)
		}
		if tag.RowsAffected() == 0 {
			res = lab.WebhookResult{Duplicate: true, Before: current, After: current}
			return nil
		}
		res = lab.WebhookResult{Before: current, After: next}
		if next == current {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE charges SET payment_state = $2 WHERE id = $1`, w.ChargeID, next); err != nil {
			return fmt.Errorf("error moving charge %s to %s: %w", w.ChargeID, next, err)
		}
		return nil
	})
	return res, err
}

// Payments lists a namespace's charges, newest first, with their payment
// state, their event's state and how many webhooks were processed for
// them ("" for every namespace; run filters when set).
func (b *Books) Payments(ctx context.Context, ns lab.Namespace, run string, limit int) ([]lab.Payment, error) {
	rows, err := b.pool.Query(ctx, `
		SELECT c.id, c.tenant_id, c.run_id, c.amount_cents, c.currency, c.payment_state,
		       coalesce((SELECT o.state FROM outbox o WHERE o.charge_id = c.id ORDER BY o.created_at LIMIT 1), ''),
		       (SELECT count(*) FROM webhook_events w WHERE w.charge_id = c.id)::int, c.created_at
		FROM charges c
		WHERE ($1 = '' OR c.namespace = $1) AND ($2 = '' OR c.run_id = $2)
		ORDER BY c.created_at DESC, c.id LIMIT $3`, string(ns), run, limit)
	if err != nil {
		return nil, fmt.Errorf("error listing payments: %w", err)
	}
	ps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (lab.Payment, error) {
		var p lab.Payment
		err := row.Scan(&p.ChargeID, &p.Tenant, &p.Run, &p.AmountCents, &p.Currency, &p.State, &p.Outbox, &p.Webhooks, &p.CreatedAt)
		p.CreatedAt = p.CreatedAt.UTC()
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("error reading payments: %w", err)
	}
	return ps, nil
}
