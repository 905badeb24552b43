// Package inmem keeps the lab's books (ledger, outbox, payment states) in
// process memory: the ground truth when no PostgreSQL is configured.
package inmem

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Books keeps the ledger, the outbox and the payment states in process
// memory: the ground truth when no PostgreSQL is configured. One mutex makes
// a charge and its event one atomic step.
type Books struct {
	mu       sync.Mutex
	now      lab.Clock
	entries  []lab.Entry
	charges  map[string]lab.Charge // by id, as answered
	orders   map[string]string     // tenant|order_id -> charge id
	balances map[string]int64      // tenant|account -> cents
	events   []*lab.Event
	byID     map[string]*lab.Event
	payments map[string]string        // charge id -> payment state
	webhooks map[string]webhookEvent  // processed provider event ids
	runs     map[string]lab.Namespace // the runs opened, by id
	owners   map[string]lab.Namespace // charge id -> its namespace
	captures map[string][]capture     // charge id -> the captures the lab recorded of it, oldest first
	pruned   map[runKey]*rollup       // what the pruned events still count for
}

// runKey names a namespace's run.
type runKey struct {
	ns  lab.Namespace
	run string
}

// rollup is what pruned events count for, per namespace and run.
type rollup struct{ delivered, retries int }

// webhookEvent is one processed provider event; mismatch says why it did
// not match its charge ("" when it did).
type webhookEvent struct {
	chargeID   string
	tenant     string
	ns         lab.Namespace
	mismatch   string
	receivedAt time.Time
}

// capture is one capture the lab recorded of a charge.
type capture struct {
	id, tenant string
	ns         lab.Namespace
	recordedAt time.Time
}

// NewBooks returns empty in-memory books telling time by now.
func NewBooks(now lab.Clock) *Books {
	b := &Books{now: now}
	b.clear()
	return b
}

func (b *Books) clear() {
	b.entries = nil
	b.charges = map[string]lab.Charge{}
	b.orders = map[string]string{}
	b.balances = map[string]int64{}
	b.events = nil
	b.byID = map[string]*lab.Event{}
	b.payments = map[string]string{}
	b.webhooks = map[string]webhookEvent{}
	b.runs = map[string]lab.Namespace{}
	b.owners = map[string]lab.Namespace{}
	b.captures = map[string][]capture{}
	b.pruned = map[runKey]*rollup{}
}

// Kind names the backend.
func (b *Books) Kind() string { return "memory" }

// Reset forgets a namespace's charges, events and webhooks ("" for all).
func (b *Books) Reset(_ context.Context, ns lab.Namespace) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ns == "" {
		b.clear()
		return nil
	}
	b.entries = slices.DeleteFunc(b.entries, func(e lab.Entry) bool {
		if !ns.Includes(e.Namespace) {
			return false
		}
		delete(b.charges, e.ChargeID)
		delete(b.owners, e.ChargeID)
		if e.OrderID != "" {
			delete(b.orders, e.Tenant+"|"+e.OrderID)
		}
		delete(b.balances, e.Tenant+"|"+e.Account)
		delete(b.payments, e.ChargeID)
		return true
	})
	b.events = slices.DeleteFunc(b.events, func(ev *lab.Event) bool {
		if !ns.Includes(ev.Namespace) {
			return false
		}
		delete(b.byID, ev.ID)
		return true
	})
	maps.DeleteFunc(b.pruned, func(k runKey, _ *rollup) bool { return k.ns == ns })
	maps.DeleteFunc(b.runs, func(_ string, owner lab.Namespace) bool { return owner == ns })
	for id, w := range b.webhooks {
		if ns.Includes(w.ns) {
			delete(b.webhooks, id)
		}
	}
	for id, cs := range b.captures {
		if ns.Includes(cs[0].ns) {
			delete(b.captures, id)
		}
	}
	return nil
}

// Apply records the entry and its event, or nothing.
func (b *Books) Apply(_ context.Context, a lab.Apply) (lab.Charge, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := a.Entry
	if c, ok := b.charges[e.ChargeID]; ok {
		return c, nil // already applied: idempotent by charge id
	}
	if e.OrderID != "" {
		if id, ok := b.orders[e.Tenant+"|"+e.OrderID]; ok {
			return lab.Charge{}, &lab.OrderConflictError{OrderID: e.OrderID, ChargeID: id}
		}
	}
	if a.Event != nil && a.FailOutbox {
		return lab.Charge{}, lab.ErrOutboxWrite
	}
	b.entries = append(b.entries, e)
	if e.OrderID != "" {
		b.orders[e.Tenant+"|"+e.OrderID] = e.ChargeID
	}
	acct := e.Tenant + "|" + e.Account
	b.balances[acct] += e.AmountCents
	b.payments[e.ChargeID] = lab.PaymentPending
	if a.Event != nil {
		ev := *a.Event
		b.events = append(b.events, &ev)
		b.byID[ev.ID] = &ev
	}
	c := lab.Charge{
		ID: e.ChargeID, Account: e.Account, AmountCents: e.AmountCents, Currency: e.Currency,
		OrderID: e.OrderID, BalanceCents: b.balances[acct], CreatedAt: e.CreatedAt,
	}
	b.charges[c.ID] = c
	b.owners[c.ID] = e.Namespace
	return c, nil
}

// OpenRun records that run belongs to namespace ns; it fails when the id
// is another namespace's.
func (b *Books) OpenRun(_ context.Context, ns lab.Namespace, run string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if owner, ok := b.runs[run]; ok && owner != ns {
		return fmt.Errorf("run %s is another namespace's", run)
	}
	b.runs[run] = ns
	return nil
}

// RunNamespace is the namespace run was opened in, or lab.ErrRunNotFound.
func (b *Books) RunNamespace(_ context.Context, run string) (lab.Namespace, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ns, ok := b.runs[run]
	if !ok {
		return "", fmt.Errorf("run %q: %w", run, lab.ErrRunNotFound)
	}
	return ns, nil
}

// RunStats counts what one run created in namespace ns, the pruned
// events from their roll-up.
func (b *Books) RunStats(_ context.Context, ns lab.Namespace, run string) (lab.RunStats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var s lab.RunStats
	for _, e := range b.entries {
		if e.Run == run && e.Namespace == ns {
			s.Charges++
			s.ChargedCents += e.AmountCents
		}
	}
	for _, ev := range b.events {
		if ev.Run == run && ev.Namespace == ns {
			s.OutboxEvents++
			switch ev.State {
			case lab.EventDelivered:
				s.Delivered++
			case lab.EventDead:
				s.Dead++
			}
		}
	}
	if r := b.pruned[runKey{ns, run}]; r != nil {
		s.OutboxEvents += r.delivered
		s.Delivered += r.delivered
	}
	return s, nil
}

// Summary aggregates a namespace's ledger per store ("" for every namespace).
func (b *Books) Summary(_ context.Context, ns lab.Namespace) ([]lab.StoreSummary, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	type op struct {
		store              lab.StoreName
		tenant, key, order string
	}
	byStore := map[lab.StoreName]*lab.StoreSummary{}
	firstAmount := map[op]int64{}
	for _, e := range b.entries {
		if !ns.Includes(e.Namespace) {
			continue
		}
		s := byStore[e.Store]
		if s == nil {
			s = &lab.StoreSummary{Store: e.Store}
			byStore[e.Store] = s
		}
		s.ChargesApplied++
		s.AmountCents += e.AmountCents
		k := op{e.Store, e.Tenant, e.Key, e.OrderID}
		if e.Key == "" { // a charge without a key is its own operation
			k.key = "charge:" + e.ChargeID
		}
		if _, seen := firstAmount[k]; !seen {
			firstAmount[k] = e.AmountCents
			s.Operations++
		}
	}
	out := make([]lab.StoreSummary, 0, len(byStore))
	for _, s := range byStore {
		var once int64
		for k, amt := range firstAmount {
			if k.store == s.Store {
				once += amt
			}
		}
		s.DuplicatesApplied = s.ChargesApplied - s.Operations
		s.OverchargedCents = s.AmountCents - once
		out = append(out, *s)
	}
	slices.SortFunc(out, func(x, y lab.StoreSummary) int { return cmp.Compare(x.Store, y.Store) })
	return out, nil
}

// Balance sums an account's charges.
func (b *Books) Balance(_ context.Context, tenant, account string) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.balances[tenant+"|"+account], nil
}

// KeyCharges tallies the charges one store made under one tenant's key.
func (b *Books) KeyCharges(_ context.Context, tenant string, store lab.StoreName, key string) (lab.KeyTally, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var k lab.KeyTally
	for _, e := range b.entries { // in commit order
		if e.Tenant == tenant && e.Store == store && e.Key == key {
			if k.Charges == 0 {
				k.FirstCents = e.AmountCents
			}
			k.Charges++
			k.Cents += e.AmountCents
			k.IDs = append(k.IDs, e.ChargeID)
		}
	}
	return k, nil
}

// AccountMoney reads an account's running balance and the sum of its
// ledger rows under one lock: one snapshot.
func (b *Books) AccountMoney(_ context.Context, tenant, account string) (lab.AccountMoney, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := lab.AccountMoney{BalanceCents: b.balances[tenant+"|"+account]}
	for _, e := range b.entries {
		if e.Tenant == tenant && e.Account == account {
			m.RowsCents += e.AmountCents
			m.Rows++
		}
	}
	return m, nil
}

// ClaimDue leases due pending events, oldest first, to one claim: each
// gets the claim's token, a lease and one more attempt.
func (b *Books) ClaimDue(_ context.Context, limit int, lease time.Duration) ([]lab.Event, error) {
	token := lab.NewClaimToken()
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	var out []lab.Event
	for _, ev := range b.events {
		if len(out) == limit {
			break
		}
		if ev.State == lab.EventPending && !ev.NextAttempt.After(now) {
			ev.Attempts++
			ev.NextAttempt = now.Add(lease)
			ev.LeaseExpires = ev.NextAttempt
			ev.ClaimToken = token
			out = append(out, *ev)
		}
	}
	return out, nil
}

// held finds the pending event the claim token still holds, or refuses.
func (b *Books) held(id, token string) (*lab.Event, error) {
	ev := b.byID[id]
	if ev == nil || ev.State != lab.EventPending || token == "" || ev.ClaimToken != token {
		return nil, fmt.Errorf("event %s: %w", id, lab.ErrFenced)
	}
	return ev, nil
}

// MarkDelivered records a successful delivery, if the claim still holds
// the event; otherwise it changes nothing and returns lab.ErrFenced.
func (b *Books) MarkDelivered(_ context.Context, id, token string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	ev, err := b.held(id, token)
	if err != nil {
		return err
	}
	ev.State = lab.EventDelivered
	ev.DeliveredAt = b.now().UTC()
	ev.LastError = ""
	ev.ClaimToken, ev.LeaseExpires = "", time.Time{}
	return nil
}

// MarkFailed schedules another try, or gives up, if the claim still holds
// the event; otherwise it changes nothing and returns lab.ErrFenced.
func (b *Books) MarkFailed(_ context.Context, id, token string, next time.Time, dead bool, reason string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	ev, err := b.held(id, token)
	if err != nil {
		return err
	}
	ev.NextAttempt = next
	ev.LastError = reason
	ev.ClaimToken, ev.LeaseExpires = "", time.Time{}
	if dead {
		ev.State = lab.EventDead
	}
	return nil
}

// Requeue puts a namespace's dead or failed event back to pending, due now
// with its attempts reset ("" for every namespace). A worker that still
// holds an old claim on it is fenced out.
func (b *Books) Requeue(_ context.Context, ns lab.Namespace, id string) (lab.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	ev := b.byID[id]
	switch {
	case ev == nil || !ns.Includes(ev.Namespace):
		return lab.Event{}, fmt.Errorf("event %s: %w", id, lab.ErrEventNotFound)
	case ev.State == lab.EventDelivered:
		return lab.Event{}, fmt.Errorf("event %s: %w", id, lab.ErrEventDelivered)
	case ev.State == lab.EventPending && ev.LeaseExpires.After(now):
		return lab.Event{}, fmt.Errorf("event %s: %w", id, lab.ErrEventInFlight)
	}
	ev.State, ev.Attempts, ev.NextAttempt = lab.EventPending, 0, now
	ev.ClaimToken, ev.LeaseExpires = "", time.Time{}
	return *ev, nil
}

// Events lists at most limit of a namespace's events, newest first.
func (b *Books) Events(_ context.Context, ns lab.Namespace, limit int) ([]lab.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]lab.Event, 0, min(limit, len(b.events)))
	for i := len(b.events) - 1; i >= 0 && len(out) < limit; i-- {
		if ns.Includes(b.events[i].Namespace) {
			out = append(out, *b.events[i])
		}
	}
	return out, nil
}

// OutboxBacklog reads a namespace's pending events and the oldest one's
// age ("" for every namespace).
func (b *Books) OutboxBacklog(ctx context.Context, ns lab.Namespace) (lab.OutboxBacklog, error) {
	st, err := b.OutboxStats(ctx, ns)
	return lab.OutboxBacklog{Pending: st.Pending, OldestPendingAge: st.OldestPendingAge}, err
}

// OutboxStats counts a namespace's events by state ("" for every namespace).
func (b *Books) OutboxStats(_ context.Context, ns lab.Namespace) (lab.OutboxStats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var s lab.OutboxStats
	now := b.now()
	for _, ev := range b.events {
		if !ns.Includes(ev.Namespace) {
			continue
		}
		s.Retries += max(ev.Attempts-1, 0)
		switch ev.State {
		case lab.EventPending:
			s.Pending++
			s.OldestPendingAge = max(s.OldestPendingAge, now.Sub(ev.CreatedAt))
			if ev.LeaseExpires.After(now) {
				s.InFlight++
			}
		case lab.EventDelivered:
			s.Delivered++
		case lab.EventDead:
			s.Dead++
		}
	}
	for k, r := range b.pruned {
		if ns.Includes(k.ns) {
			s.Delivered += r.delivered
			s.Retries += r.retries
		}
	}
	return s, nil
}
