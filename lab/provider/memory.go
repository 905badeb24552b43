package provider

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Memory keeps the provider's records in this process: for tests and for
// a lab without PostgreSQL. Its answers match the PostgreSQL records'. Its
// webhooks outlive a Provider (another on the same records sends them),
// not the process.
type Memory struct {
	mu       sync.Mutex
	seq      int64 // insertion order, which breaks ties between equal times
	captures map[captureKey]*memCapture
	receipts map[string]*memReceipt
	pending  []*Webhook // webhooks not yet delivered or dead, in the order they were written
	done     []doneHook // the others, kept for Stats until pruned
	pruned   map[rollupKey]*rollup
}

type captureKey struct{ tenant, key string }

type memCapture struct {
	Capture
	seq int64
}

// memReceipt is a receipt and when it was last received, which is what
// its retention runs from.
type memReceipt struct {
	Receipt
	last time.Time
}

// doneHook is a webhook delivered or dead, and since when.
type doneHook struct {
	*Webhook
	at time.Time
}

// rollupKey and rollup are what the pruned records still count in Stats,
// per namespace and run.
type rollupKey struct{ ns, run string }

type rollup struct{ receipts, deliveries, webhooks int }

var _ Pruner = (*Memory)(nil)

// NewMemory returns empty records.
func NewMemory() *Memory {
	return &Memory{captures: map[captureKey]*memCapture{}, receipts: map[string]*memReceipt{}, pruned: map[rollupKey]*rollup{}}
}

// Capture records c once per (tenant, key), with hooks when it applies;
// see Records.
func (m *Memory) Capture(_ context.Context, c Capture, hooks []Webhook, receipt *Receipt) (Captured, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := captureKey{c.Tenant, c.Key}
	if old, ok := m.captures[k]; ok {
		if old.Fingerprint != c.Fingerprint {
			return Captured{}, ErrKeyMismatch
		}
		old.Requests++
		return Captured{Capture: old.Capture, Replayed: true, ReceiptDuplicate: m.receipt(receipt)}, nil
	}
	m.seq++
	c.Requests = 1
	c.CreatedAt = normalTime(c.CreatedAt)
	m.captures[k] = &memCapture{Capture: c, seq: m.seq}
	for _, h := range hooks {
		// A webhook is about its capture: it carries the capture's charge, tenant and run.
		h.CaptureID, h.ChargeID, h.Tenant, h.Run = c.ID, c.ChargeID, c.Tenant, c.Run
		h.State, h.Attempts, h.ClaimToken = WebhookPending, 0, ""
		h.NextAttempt, h.GiveUpAt, h.CreatedAt = normalTime(h.NextAttempt), normalTime(h.GiveUpAt), normalTime(h.CreatedAt)
		m.pending = append(m.pending, &h)
	}
	return Captured{Capture: c, ReceiptDuplicate: m.receipt(receipt)}, nil
}

// ClaimWebhooks leases due webhooks, each the first pending one of its
// capture; see Records.
func (m *Memory) ClaimWebhooks(_ context.Context, now time.Time, limit int, lease time.Duration) ([]Webhook, error) {
	token := uuid.NewString()
	now = normalTime(now)
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Webhook
	waiting := map[string]bool{} // captures with a pending webhook before the one at hand
	for _, w := range m.pending {
		if len(out) == limit {
			break
		}
		first := !waiting[w.CaptureID]
		waiting[w.CaptureID] = true
		if !first || w.NextAttempt.After(now) {
			continue
		}
		w.Attempts++
		w.ClaimToken = token
		w.NextAttempt = now.Add(lease)
		out = append(out, *w)
	}
	return out, nil
}

// held finds the pending webhook w's claim still holds (callers hold mu).
func (m *Memory) held(w Webhook) (int, error) {
	i := slices.IndexFunc(m.pending, func(p *Webhook) bool { return p.CaptureID == w.CaptureID && p.Seq == w.Seq })
	if i < 0 || w.ClaimToken == "" || m.pending[i].ClaimToken != w.ClaimToken {
		return 0, fmt.Errorf("webhook %s of capture %s: %w", w.EventID, w.CaptureID, ErrWebhookFenced)
	}
	return i, nil
}

// WebhookDelivered records w delivered; see Records.
func (m *Memory) WebhookDelivered(_ context.Context, w Webhook, at time.Time, status int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, err := m.held(w)
	if err != nil {
		return err
	}
	h := m.pending[i]
	h.State, h.ClaimToken, h.LastStatus, h.LastError = WebhookDelivered, "", status, ""
	m.pending = slices.Delete(m.pending, i, i+1)
	m.done = append(m.done, doneHook{Webhook: h, at: normalTime(at)})
	return nil
}

// WebhookFailed schedules w again at next, or gives it up; see Records.
func (m *Memory) WebhookFailed(_ context.Context, w Webhook, next time.Time, dead bool, status int, reason string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, err := m.held(w)
	if err != nil {
		return err
	}
	h := m.pending[i]
	h.NextAttempt, h.ClaimToken, h.LastStatus, h.LastError = normalTime(next), "", status, reason
	if dead {
		h.State = WebhookDead
		m.pending = slices.Delete(m.pending, i, i+1)
		m.done = append(m.done, doneHook{Webhook: h, at: h.NextAttempt})
	}
	return nil
}

// Receipt records r once per event id; see Records.
func (m *Memory) Receipt(_ context.Context, r Receipt) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.receipt(&r), nil
}

// receipt records r (nil: none) under m.mu and reports whether it was
// there already.
func (m *Memory) receipt(r *Receipt) bool {
	if r == nil {
		return false
	}
	if old, ok := m.receipts[r.EventID]; ok {
		old.Deliveries++
		old.last = normalTime(r.ReceivedAt)
		return true
	}
	kept := *r
	kept.Deliveries = 1
	kept.ReceivedAt = normalTime(r.ReceivedAt)
	m.receipts[r.EventID] = &memReceipt{Receipt: kept, last: kept.ReceivedAt}
	return false
}

func (f Filter) matches(ns, run, chargeID string) bool {
	return (f.Namespace == "" || ns == f.Namespace) &&
		(f.Run == "" || run == f.Run) && (f.ChargeID == "" || chargeID == f.ChargeID)
}

// Captures lists the captures f selects, newest first.
func (m *Memory) Captures(_ context.Context, f Filter) ([]Capture, error) {
	m.mu.Lock()
	var found []memCapture // copies: a capture's count moves under the lock
	for _, c := range m.captures {
		if f.matches(c.Namespace, c.Run, c.ChargeID) {
			found = append(found, *c)
		}
	}
	m.mu.Unlock()
	slices.SortFunc(found, func(a, b memCapture) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.seq, a.seq)
	})
	out := make([]Capture, 0, min(len(found), f.EffectiveLimit()))
	for _, c := range found[:min(len(found), f.EffectiveLimit())] {
		out = append(out, c.Capture)
	}
	return out, nil
}

// Stats sums what f selects.
func (m *Memory) Stats(_ context.Context, f Filter) (Stats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var s Stats
	perCharge := map[string]int{}
	for _, c := range m.captures {
		if !f.matches(c.Namespace, c.Run, c.ChargeID) {
			continue
		}
		s.CapturesApplied++
		s.CaptureRequests += c.Requests
		if c.Status == StatusSucceeded {
			s.CapturedCents += c.AmountCents
		}
		if c.Via == ViaDirect {
			s.DirectCaptures++
		}
		if perCharge[c.ChargeID]++; perCharge[c.ChargeID] == 2 {
			s.ChargesCapturedTwice++
		}
	}
	for _, r := range m.receipts {
		if f.matches(r.Namespace, r.Run, r.ChargeID) {
			s.Receipts++
			s.ReceiptDeliveries += r.Deliveries
		}
	}
	for _, w := range m.pending {
		if f.matches(w.Namespace, w.Run, w.ChargeID) {
			s.WebhooksQueued++
		}
	}
	for _, w := range m.done {
		switch {
		case !f.matches(w.Namespace, w.Run, w.ChargeID):
		case w.State == WebhookDelivered:
			s.WebhooksDelivered++
		default:
			s.WebhooksDead++
		}
	}
	if f.ChargeID == "" { // the roll-up knows no charge
		for k, r := range m.pruned {
			if f.matches(k.ns, k.run, "") {
				s.Receipts += r.receipts
				s.ReceiptDeliveries += r.deliveries
				s.WebhooksDelivered += r.webhooks
			}
		}
	}
	return s, nil
}

// Queued counts the webhooks still to send.
func (m *Memory) Queued(context.Context) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, w := range m.pending {
		if !refused(w.LastStatus) {
			n++
		}
	}
	return n, nil
}

// Reset forgets a namespace's records ("" = everything).
func (m *Memory) Reset(_ context.Context, ns string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, c := range m.captures {
		if ns == "" || c.Namespace == ns {
			delete(m.captures, k)
		}
	}
	for id, r := range m.receipts {
		if ns == "" || r.Namespace == ns {
			delete(m.receipts, id)
		}
	}
	mine := func(w *Webhook) bool { return ns == "" || w.Namespace == ns }
	m.pending = slices.DeleteFunc(m.pending, mine)
	m.done = slices.DeleteFunc(m.done, func(d doneHook) bool { return mine(d.Webhook) })
	maps.DeleteFunc(m.pruned, func(k rollupKey, _ *rollup) bool { return ns == "" || k.ns == ns })
	return nil
}

// rolled is the roll-up of a namespace's run (callers hold mu).
func (m *Memory) rolled(ns, run string) *rollup {
	k := rollupKey{ns, run}
	if m.pruned[k] == nil {
		m.pruned[k] = &rollup{}
	}
	return m.pruned[k]
}

// PruneReceipts deletes at most limit receipts last received before
// before, oldest first, counting them in the roll-up; see Pruner.
func (m *Memory) PruneReceipts(_ context.Context, before time.Time, limit int) (int, error) {
	before = normalTime(before)
	m.mu.Lock()
	defer m.mu.Unlock()
	var old []*memReceipt
	for _, r := range m.receipts {
		if r.last.Before(before) {
			old = append(old, r)
		}
	}
	slices.SortFunc(old, func(a, b *memReceipt) int { return a.last.Compare(b.last) })
	old = old[:min(len(old), limit)]
	for _, r := range old {
		ru := m.rolled(r.Namespace, r.Run)
		ru.receipts++
		ru.deliveries += r.Deliveries
		delete(m.receipts, r.EventID)
	}
	return len(old), nil
}

// PruneWebhooks deletes at most limit webhooks delivered before before,
// oldest first, counting them in the roll-up; see Pruner.
func (m *Memory) PruneWebhooks(_ context.Context, before time.Time, limit int) (int, error) {
	before = normalTime(before)
	m.mu.Lock()
	defer m.mu.Unlock()
	var old []doneHook
	for _, d := range m.done {
		if d.State == WebhookDelivered && d.at.Before(before) {
			old = append(old, d)
		}
	}
	slices.SortStableFunc(old, func(a, b doneHook) int { return a.at.Compare(b.at) })
	old = old[:min(len(old), limit)]
	gone := map[*Webhook]bool{}
	for _, d := range old {
		m.rolled(d.Namespace, d.Run).webhooks++
		gone[d.Webhook] = true
	}
	m.done = slices.DeleteFunc(m.done, func(d doneHook) bool { return gone[d.Webhook] })
	return len(old), nil
}
