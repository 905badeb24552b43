package pgdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-lab/lab/lab"
)

// RecordCapture keeps a capture the lab made of a charge, as the provider
// answered it; recording it again changes nothing. The charge need not be
// in the ledger yet: a direct send captures before its charge is written.
func (b *Books) RecordCapture(ctx context.Context, _ lab.Namespace, chargeID, tenant, captureID string) error { // the namespace column is the tenant's
	if _, err := b.pool.Exec(ctx, `
		INSERT INTO charge_captures (charge_id, capture_id, tenant_id, recorded_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (charge_id, capture_id) DO NOTHING`, chargeID, captureID, tenant, b.now()); err != nil {
		return fmt.Errorf("error recording capture %s of charge %s: %w", captureID, chargeID, err)
	}
	return nil
}

// ApplyWebhook processes one verified provider event in one transaction:
// the charge row is locked, the event is matched with it (lab.MatchWebhook:
// the ledger's amount and currency, the captures the lab recorded, or the
// lab's own capture key, whose capture is then recorded), the event id is
// recorded (its primary key turns a redelivery into a duplicate that
// changes nothing), and the state machine moves the charge when the event
// matched. A mismatch is recorded and moves nothing. An
// event about a charge the ledger does not hold, or that would move a
// charge of which no capture is recorded, records nothing and returns
// lab.ErrUnknownCharge or lab.ErrCaptureNotRecorded, so the provider's
// retry is processed later.
func (b *Books) ApplyWebhook(ctx context.Context, w lab.Webhook) (lab.WebhookResult, error) {
	var res lab.WebhookResult
	err := pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		res = lab.WebhookResult{}
		var terms lab.ChargeTerms
		err := tx.QueryRow(ctx, `
			SELECT payment_state, amount_cents, currency,
			       ARRAY(SELECT capture_id FROM charge_captures cc WHERE cc.charge_id = c.id AND cc.tenant_id = c.tenant_id ORDER BY recorded_at, capture_id)
			FROM charges c WHERE id = $1 AND tenant_id = $2 FOR UPDATE OF c`, w.ChargeID, w.Tenant).
			Scan(&terms.State, &terms.AmountCents, &terms.Currency, &terms.Captures)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("charge %s: %w", w.ChargeID, lab.ErrUnknownCharge)
		}
		if err != nil {
			return fmt.Errorf("error locking charge %s: %w", w.ChargeID, err)
		}
		current := terms.State
		next, err := lab.NextPaymentState(current, w.Type)
		if err != nil {
			return err
		}
		mismatch, err := lab.MatchWebhook(w, terms)
		if errors.Is(err, lab.ErrCaptureNotRecorded) {
			var seen bool
			if qerr := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM webhook_events WHERE event_id = $1)`, w.EventID).Scan(&seen); qerr != nil {
				return fmt.Errorf("error looking up webhook %s: %w", w.EventID, qerr)
			}
			if seen {
				res = lab.WebhookResult{Duplicate: true, Before: current, After: current}
				return nil
			}
		}
		if err != nil {
			return err
		}
		if mismatch != "" {
			next = current
		}
		// One statement records the event and, when it is new and moves
		// the charge, moves it and settles its captures (a capture settled
		// leaves the index the stuck gauge reads); the lab's own capture,
		// told by the webhook before the relay recorded it, is recorded
		// with it, settled if the charge moved (the relay's record of it,
		// committed meanwhile, is settled instead). A twin of this event
		// waits on webhook_events' primary key until the first commits,
		// then inserts nothing and moves nothing.
		var recorded bool
		err = tx.QueryRow(ctx, `
			WITH recorded AS (
				INSERT INTO webhook_events (event_id, event_type, charge_id, tenant_id, state_before, state_after, received_at,
					capture_id, amount_cents, currency, mismatch)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, nullif($11, '')) ON CONFLICT (event_id) DO NOTHING
				RETURNING event_id
			), moved AS (
				UPDATE charges SET payment_state = $6 WHERE id = $3 AND $6::text <> $5::text AND EXISTS (SELECT 1 FROM recorded)
				RETURNING id
			), settled AS (
				UPDATE charge_captures SET settled = true WHERE charge_id = $3 AND NOT settled AND EXISTS (SELECT 1 FROM moved)
			), captured AS (
				INSERT INTO charge_captures (charge_id, capture_id, tenant_id, recorded_at, settled)
				SELECT $3, $8, $4, $7, EXISTS (SELECT 1 FROM moved) WHERE $12 AND EXISTS (SELECT 1 FROM recorded)
				ON CONFLICT (charge_id, capture_id) DO UPDATE SET settled = charge_captures.settled OR excluded.settled
			)
			SELECT EXISTS (SELECT 1 FROM recorded)`,
			w.EventID, w.Type, w.ChargeID, w.Tenant, current, next, w.ReceivedAt, w.CaptureID, w.AmountCents, w.Currency, mismatch,
			mismatch == "" && w.RecordsCapture(terms)).Scan(&recorded)
		if err != nil {
			return fmt.Errorf("error recording webhook %s for charge %s: %w", w.EventID, w.ChargeID, err)
		}
		if !recorded {
			res = lab.WebhookResult{Duplicate: true, Before: current, After: current}
			return nil
		}
		res = lab.WebhookResult{Before: current, After: next, Mismatch: mismatch}
		return nil
	})
	return res, err
}

// Payments lists a namespace's charges, newest first, with their payment
// state, their event's state, their recorded captures and how many
// webhooks were processed for them ("" for every namespace; run filters
// when set). A namespace's newest charges are read from its index in
// creation order, whatever its ledger holds. An event the pruner deleted
// (it was delivered) reads as none, which reconcile takes as settled, as
// it takes a delivered one.
func (b *Books) Payments(ctx context.Context, ns lab.Namespace, run string, limit int) ([]lab.Payment, error) {
	inRun := "c.run_id = $2"
	if run == "" {
		inRun = "$2 = ''"
	}
	rows, err := b.pool.Query(ctx, `
		SELECT c.id, c.tenant_id, c.run_id, c.amount_cents, c.currency, c.payment_state,
		       coalesce((SELECT o.state FROM outbox o WHERE o.charge_id = c.id ORDER BY o.created_at LIMIT 1), ''),
		       wh.matched, c.created_at,
		       coalesce(cap.capture_id, ''), coalesce(cap.first_at, 'epoch'::timestamptz),
		       wh.mismatched, coalesce(wh.mismatch, '')
		FROM charges c
		LEFT JOIN LATERAL (
			SELECT (array_agg(cc.capture_id ORDER BY cc.recorded_at DESC, cc.capture_id))[1] AS capture_id, min(cc.recorded_at) AS first_at
			FROM charge_captures cc WHERE cc.charge_id = c.id AND cc.tenant_id = c.tenant_id) cap ON true
		CROSS JOIN LATERAL ( -- one walk of the charge's webhook events, not one per figure
			SELECT count(*) FILTER (WHERE w.mismatch IS NULL)::int AS matched, count(*) FILTER (WHERE w.mismatch IS NOT NULL)::int AS mismatched,
			       (array_agg(w.mismatch ORDER BY w.received_at DESC) FILTER (WHERE w.mismatch IS NOT NULL))[1] AS mismatch
			FROM webhook_events w WHERE w.charge_id = c.id) wh
		WHERE `+InNamespace(ns, 1)+` AND `+inRun+`
		ORDER BY c.created_at DESC, c.id LIMIT $3`, string(ns), run, limit)
	if err != nil {
		return nil, fmt.Errorf("error listing payments: %w", err)
	}
	ps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (lab.Payment, error) {
		var p lab.Payment
		err := row.Scan(&p.ChargeID, &p.Tenant, &p.Run, &p.AmountCents, &p.Currency, &p.State, &p.Outbox, &p.Webhooks, &p.CreatedAt,
			&p.CaptureID, &p.CapturedAt, &p.Mismatched, &p.Mismatch)
		p.CreatedAt = p.CreatedAt.UTC()
		if p.CapturedAt.Unix() == 0 {
			p.CapturedAt = time.Time{}
		} else {
			p.CapturedAt = p.CapturedAt.UTC()
		}
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("error reading payments: %w", err)
	}
	return ps, nil
}

// OldestStuck is how long the oldest charge still pending more than after
// past the lab's first recorded capture of it has waited since that
// capture: its webhook never came. Zero when none. It reads the captures
// not yet settled (a partial index), not the ledger.
func (b *Books) OldestStuck(ctx context.Context, after time.Duration) (time.Duration, error) {
	var secs float64
	err := b.pool.QueryRow(ctx, `
		SELECT coalesce(extract(epoch FROM $1::timestamptz - min(cc.recorded_at)), 0)::float8
		FROM charge_captures cc JOIN charges c ON c.id = cc.charge_id AND c.tenant_id = cc.tenant_id
		WHERE NOT cc.settled AND cc.recorded_at < $1::timestamptz - make_interval(secs => $2) AND c.payment_state = 'pending'`,
		b.now(), after.Seconds()).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("error reading the oldest stuck charge: %w", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}
