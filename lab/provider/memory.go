package provider

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/idempotency-lab/lab/lab"
)

// Memory keeps the provider's records in this process: for tests and for
// a lab without PostgreSQL. Its answers match the PostgreSQL records'.
type Memory struct {
	mu       sync.Mutex
	seq      int64 // insertion order, which breaks ties between equal times
	captures map[captureKey]*memCapture
	receipts map[string]*Receipt
}

type captureKey struct{ tenant, key string }

type memCapture struct {
	Capture
	seq int64
}

// NewMemory returns empty records.
func NewMemory() *Memory {
	return &Memory{captures: map[captureKey]*memCapture{}, receipts: map[string]*Receipt{}}
}

// Capture records c once per (tenant, key); see Records.
func (m *Memory) Capture(_ context.Context, c Capture) (Capture, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := captureKey{c.Tenant, c.Key}
	if old, ok := m.captures[k]; ok {
		if old.Fingerprint != c.Fingerprint {
			return Capture{}, false, ErrKeyMismatch
		}
		old.Requests++
		return old.Capture, true, nil
	}
	m.seq++
	c.Requests = 1
	c.CreatedAt = normalTime(c.CreatedAt)
	m.captures[k] = &memCapture{Capture: c, seq: m.seq}
	return c, false, nil
}

// Receipt records r once per event id; see Records.
func (m *Memory) Receipt(_ context.Context, r Receipt) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.receipts[r.EventID]; ok {
		old.Deliveries++
		return true, nil
	}
	r.Deliveries = 1
	r.ReceivedAt = normalTime(r.ReceivedAt)
	m.receipts[r.EventID] = &r
	return false, nil
}

func (f Filter) matches(tenant, run, chargeID string) bool {
	return (f.Namespace == "" || string(lab.NamespaceOf(tenant)) == f.Namespace) &&
		(f.Run == "" || run == f.Run) && (f.ChargeID == "" || chargeID == f.ChargeID)
}

// Captures lists the captures f selects, newest first.
func (m *Memory) Captures(_ context.Context, f Filter) ([]Capture, error) {
	m.mu.Lock()
	var found []memCapture // copies: a capture's count moves under the lock
	for _, c := range m.captures {
		if f.matches(c.Tenant, c.Run, c.ChargeID) {
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
		if !f.matches(c.Tenant, c.Run, c.ChargeID) {
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
		if f.matches(r.Tenant, r.Run, r.ChargeID) {
			s.Receipts++
			s.ReceiptDeliveries += r.Deliveries
		}
	}
	return s, nil
}

// Reset forgets a namespace's records ("" = everything).
func (m *Memory) Reset(_ context.Context, ns string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, c := range m.captures {
		if ns == "" || string(lab.NamespaceOf(c.Tenant)) == ns {
			delete(m.captures, k)
		}
	}
	for id, r := range m.receipts {
		if ns == "" || string(lab.NamespaceOf(r.Tenant)) == ns {
			delete(m.receipts, id)
		}
	}
	return nil
}
