package inmem

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// RecordCapture keeps a capture the lab made of a charge; recording it
// again changes nothing. The charge need not be in the ledger yet.
func (b *Books) RecordCapture(_ context.Context, ns lab.Namespace, chargeID, tenant, captureID string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.captures[chargeID] {
		if c.id == captureID {
			return nil
		}
	}
	b.captures[chargeID] = append(b.captures[chargeID], capture{id: captureID, tenant: tenant, ns: ns, recordedAt: b.now().UTC()})
	return nil
}

// ApplyWebhook processes one verified provider event under the books' lock:
// an event id seen before changes nothing; the event is matched with its
// charge (lab.MatchWebhook), and the state machine moves the charge when it
// matched. A mismatch is recorded and moves nothing. An event about a
// charge the ledger does not hold, or that would move a charge of which no
// capture is recorded, records nothing and returns lab.ErrUnknownCharge or
// lab.ErrCaptureNotRecorded.
func (b *Books) ApplyWebhook(_ context.Context, w lab.Webhook) (lab.WebhookResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	current, ok := b.payments[w.ChargeID]
	e, held := b.entryOf(w.ChargeID)
	if !ok || !held || e.Tenant != w.Tenant {
		return lab.WebhookResult{}, fmt.Errorf("charge %s: %w", w.ChargeID, lab.ErrUnknownCharge)
	}
	next, err := lab.NextPaymentState(current, w.Type)
	if err != nil {
		return lab.WebhookResult{}, err
	}
	if _, seen := b.webhooks[w.EventID]; seen {
		return lab.WebhookResult{Duplicate: true, Before: current, After: current}, nil
	}
	terms := lab.ChargeTerms{State: current, AmountCents: e.AmountCents, Currency: e.Currency}
	for _, c := range b.captures[w.ChargeID] {
		if c.tenant == w.Tenant {
			terms.Captures = append(terms.Captures, c.id)
		}
	}
	mismatch, err := lab.MatchWebhook(w, terms)
	if err != nil {
		return lab.WebhookResult{}, err
	}
	if mismatch != "" {
		next = current
	} else if w.RecordsCapture(terms) {
		b.captures[w.ChargeID] = append(b.captures[w.ChargeID], capture{id: w.CaptureID, tenant: w.Tenant, ns: b.owners[w.ChargeID], recordedAt: w.ReceivedAt})
	}
	b.webhooks[w.EventID] = webhookEvent{chargeID: w.ChargeID, tenant: w.Tenant, ns: b.owners[w.ChargeID], mismatch: mismatch, receivedAt: w.ReceivedAt}
	b.payments[w.ChargeID] = next
	return lab.WebhookResult{Before: current, After: next, Mismatch: mismatch}, nil
}

// entryOf finds the ledger entry of a charge (callers hold mu).
func (b *Books) entryOf(chargeID string) (lab.Entry, bool) {
	for i := len(b.entries) - 1; i >= 0; i-- {
		if b.entries[i].ChargeID == chargeID {
			return b.entries[i], true
		}
	}
	return lab.Entry{}, false
}

// Payments lists a namespace's charges, newest first, with their payment
// state, their event's state, their recorded captures and how many
// webhooks were processed for them.
func (b *Books) Payments(_ context.Context, ns lab.Namespace, run string, limit int) ([]lab.Payment, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	webhooks, mismatched := map[string]int{}, map[string]int{}
	latest := map[string]webhookEvent{}
	for _, w := range b.webhooks {
		if w.mismatch == "" {
			webhooks[w.chargeID]++
			continue
		}
		mismatched[w.chargeID]++
		if l, ok := latest[w.chargeID]; !ok || w.receivedAt.After(l.receivedAt) {
			latest[w.chargeID] = w
		}
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
		if !ns.Includes(e.Namespace) || (run != "" && e.Run != run) {
			continue
		}
		p := lab.Payment{
			ChargeID: e.ChargeID, Tenant: e.Tenant, Run: e.Run, AmountCents: e.AmountCents, Currency: e.Currency,
			State: b.payments[e.ChargeID], Outbox: outbox[e.ChargeID], Webhooks: webhooks[e.ChargeID], CreatedAt: e.CreatedAt,
			Mismatched: mismatched[e.ChargeID], Mismatch: latest[e.ChargeID].mismatch,
		}
		for _, c := range b.captures[e.ChargeID] {
			if c.tenant != e.Tenant {
				continue
			}
			if p.CapturedAt.IsZero() {
				p.CapturedAt = c.recordedAt
			}
			p.CaptureID = c.id
		}
		out = append(out, p)
	}
	return out, nil
}

// OldestStuck is how long the oldest charge still pending more than after
// past the lab's first recorded capture of it has waited since that
// capture: its webhook never came. Zero when none.
func (b *Books) OldestStuck(_ context.Context, after time.Duration) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	var oldest time.Duration
	for id, cs := range b.captures {
		if state, held := b.payments[id]; !held || state != lab.PaymentPending {
			continue // settled, or not in the ledger (a direct send rolled back)
		}
		if age := now.Sub(cs[0].recordedAt); age > after {
			oldest = max(oldest, age)
		}
	}
	return oldest, nil
}
