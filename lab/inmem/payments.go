package inmem

import (
	"context"
	"fmt"
	"slices"

	"github.com/idempotency-lab/lab/lab"
)

// ApplyWebhook processes one verified provider event under the books' lock:
// an event id seen before changes nothing, and the state machine moves the
// charge. An event about a charge the ledger does not hold records nothing
// and returns lab.ErrUnknownCharge.
func (b *Books) ApplyWebhook(_ context.Context, w lab.Webhook) (lab.WebhookResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	current, ok := b.payments[w.ChargeID]
	if !ok || b.tenantOf(w.ChargeID) != w.Tenant {
		return lab.WebhookResult{}, fmt.Errorf("charge %s: %w", w.ChargeID, lab.ErrUnknownCharge)
	}
	next, err := lab.NextPaymentState(current, w.Type)
	if err != nil {
		return lab.WebhookResult{}, err
	}
	if _, seen := b.webhooks[w.EventID]; seen {
		return lab.WebhookResult{Duplicate: true, Before: current, After: current}, nil
	}
	b.webhooks[w.EventID] = webhookEvent{chargeID: w.ChargeID, tenant: w.Tenant}
	b.payments[w.ChargeID] = next
	return lab.WebhookResult{Before: current, After: next}, nil
}

// tenantOf finds the tenant of a charge (callers hold mu).
func (b *Books) tenantOf(chargeID string) string {
	for i := len(b.entries) - 1; i >= 0; i-- {
		if b.entries[i].ChargeID == chargeID {
			return b.entries[i].Tenant
		}
	}
	return ""
}

// Payments lists a namespace's charges, newest first, with their payment
// state, their event's state and how many webhooks were processed for them.
func (b *Books) Payments(_ context.Context, ns lab.Namespace, run string, limit int) ([]lab.Payment, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	webhooks := map[string]int{}
	for _, w := range b.webhooks {
		webhooks[w.chargeID]++
	}
	outbox := map[string]string{}
	for _, ev := range b.events {
		if _, ok := outbox[ev.ChargeID]; !ok {
			outbox[ev.ChargeID] = ev.State
		}
	}
	var out []lab.Payment
	for _, e := range slices.Backward(b.entries) {
		if len(out) == limit {
			break
		}
		if (ns != "" && !ns.Owns(e.Tenant)) || (run != "" && e.Run != run) {
			continue
		}
		out = append(out, lab.Payment{
			ChargeID: e.ChargeID, Tenant: e.Tenant, Run: e.Run, AmountCents: e.AmountCents, Currency: e.Currency,
			State: b.payments[e.ChargeID], Outbox: outbox[e.ChargeID], Webhooks: webhooks[e.ChargeID], CreatedAt: e.CreatedAt,
		})
	}
	return out, nil
}
