// Package bookstest holds every implementation of the lab's books (the
// ledger, the outbox and the payment states: lab/inmem in memory,
// lab/pgdb in PostgreSQL) to one set of cases. Each implementation's own
// test calls Exercise once; a new implementation gets the whole set by
// that one call.
package bookstest

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// Books is what the lab asks of its books.
type Books interface {
	lab.Ledger
	lab.CaptureRecorder
	Kind() string
	OpenRun(ctx context.Context, ns lab.Namespace, run string) error
	RunNamespace(ctx context.Context, run string) (lab.Namespace, error)
	RunStats(ctx context.Context, ns lab.Namespace, run string) (lab.RunStats, error)
	Summary(ctx context.Context, ns lab.Namespace) ([]lab.StoreSummary, error)
	Balance(ctx context.Context, tenant, account string) (int64, error)
	KeyCharges(ctx context.Context, tenant string, store lab.StoreName, key string) (lab.KeyTally, error)
	ClaimDue(ctx context.Context, limit int, lease time.Duration) ([]lab.Event, error)
	MarkDelivered(ctx context.Context, id, token string) error
	MarkFailed(ctx context.Context, id, token string, next time.Time, dead bool, reason string) error
	Requeue(ctx context.Context, ns lab.Namespace, id string) (lab.Event, error)
	Events(ctx context.Context, ns lab.Namespace, limit int) ([]lab.Event, error)
	OutboxStats(ctx context.Context, ns lab.Namespace) (lab.OutboxStats, error)
	OutboxBacklog(ctx context.Context, ns lab.Namespace) (lab.OutboxBacklog, error)
	Reset(ctx context.Context, ns lab.Namespace) error
	ApplyWebhook(ctx context.Context, w lab.Webhook) (lab.WebhookResult, error)
	Payments(ctx context.Context, ns lab.Namespace, run string, limit int) ([]lab.Payment, error)
	OldestStuck(ctx context.Context, after time.Duration) (time.Duration, error)
	PruneDelivered(ctx context.Context, before time.Time, limit int) (int, error)
	PruneWebhookEvents(ctx context.Context, before time.Time, limit int) (int, error)
}

// Open returns empty books of the test's own that tell time by now.
type Open func(t *testing.T, now lab.Clock) Books

// Exercise runs every case on books open makes, each case on books of its
// own, in parallel.
func Exercise(t *testing.T, open Open) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// On whole seconds, which PostgreSQL keeps as they are.
			clock := labtest.NewClock(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
			c.run(t, &env{b: open(t, clock.Now), clock: clock})
		})
	}
}

var cases = []struct {
	name string
	run  func(t *testing.T, e *env)
}{
	{"ApplyRecordsTheChargeAndItsEvent", applyRecordsTheChargeAndItsEvent},
	{"ApplyIsIdempotentByChargeID", applyIsIdempotentByChargeID},
	{"DuplicatesAreCountedPerOperation", duplicatesAreCountedPerOperation},
	{"OrderIDAppliesOnce", orderIDAppliesOnce},
	{"OutboxFailureKeepsNothing", outboxFailureKeepsNothing},
	{"RunsBelongToOneNamespace", runsBelongToOneNamespace},
	{"ClaimsAreFenced", claimsAreFenced},
	{"FailedEventsRetryThenDie", failedEventsRetryThenDie},
	{"TheBacklogIsWhatIsPending", theBacklogIsWhatIsPending},
	{"Requeue", requeue},
	{"ResetForgetsOneNamespace", resetForgetsOneNamespace},
	{"WebhooksMoveMatchingCharges", webhooksMoveMatchingCharges},
	{"TheLabsOwnCaptureToldByItsWebhook", ownCaptureToldByItsWebhook},
	{"StuckChargeAges", stuckChargeAges},
	{"PruningKeepsTheTotals", pruningKeepsTheTotals},
}

// The namespaces of the cases: acme and globex are tenants of their own
// namespaces.
const (
	acme   = lab.Namespace("acme")
	globex = lab.Namespace("globex")
)

// env is one case's books and clock.
type env struct {
	b     Books
	clock *labtest.Clock
}

// charge is the Apply of one charge of cents in ns under key, in run, with
// its receipt event.
func (e *env) charge(ns lab.Namespace, key, run string, cents int64) lab.Apply {
	entry := lab.Entry{
		ChargeID: lab.NewChargeID(), Namespace: ns, Tenant: string(ns), Account: "acct-1", AmountCents: cents,
		Currency: "USD", Key: key, Store: "memory", Run: run, Replica: "r1", CreatedAt: e.clock.Now(),
	}
	return lab.Apply{Entry: entry, Event: lab.NewReceiptEvent(entry, lab.Faults{})}
}

// apply applies a, which must succeed.
func (e *env) apply(t *testing.T, a lab.Apply) lab.Charge {
	t.Helper()
	c, err := e.b.Apply(t.Context(), a)
	if err != nil {
		t.Fatalf("Apply %s: %v", a.Entry.ChargeID, err)
	}
	return c
}

// ledger checks the figures of ns's ledger and outbox.
func (e *env) ledger(t *testing.T, ns lab.Namespace, charges, events int) {
	t.Helper()
	var applied int
	sum, err := e.b.Summary(t.Context(), ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sum {
		applied += s.ChargesApplied
	}
	st, err := e.b.OutboxStats(t.Context(), ns)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Pending + st.Delivered + st.Dead; applied != charges || got != events {
		t.Fatalf("%q holds %d charges and %d outbox events (%+v), want %d and %d", ns, applied, got, st, charges, events)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func applyRecordsTheChargeAndItsEvent(t *testing.T, e *env) {
	ctx := t.Context()
	a := e.charge(acme, "k1", "run-1", 2500)
	c := e.apply(t, a)
	if c.ID != a.Entry.ChargeID || c.AmountCents != 2500 || c.BalanceCents != 2500 || c.Currency != "USD" || !c.CreatedAt.Equal(a.Entry.CreatedAt) {
		t.Fatalf("Apply answered %+v", c)
	}
	e.ledger(t, acme, 1, 1)
	if bal, err := e.b.Balance(ctx, "acme", "acct-1"); err != nil || bal != 2500 {
		t.Fatalf("balance %d (%v), want 2500", bal, err)
	}
	if k, err := e.b.KeyCharges(ctx, "acme", "memory", "k1"); err != nil || k.Charges != 1 || k.Cents != 2500 || k.FirstCents != 2500 || !slices.Equal(k.IDs, []string{c.ID}) {
		t.Fatalf("key tally %+v (%v), want the one charge", k, err)
	}
	evs, err := e.b.Events(ctx, acme, 10)
	if err != nil || len(evs) != 1 || evs[0].ID != a.Event.ID || evs[0].ChargeID != c.ID || evs[0].State != lab.EventPending || evs[0].Run != "run-1" {
		t.Fatalf("events %+v (%v), want the charge's receipt, pending", evs, err)
	}
	ps, err := e.b.Payments(ctx, acme, "run-1", 10)
	if err != nil || len(ps) != 1 || ps[0].ChargeID != c.ID || ps[0].State != lab.PaymentPending || ps[0].Outbox != lab.EventPending || ps[0].AmountCents != 2500 {
		t.Fatalf("payments %+v (%v), want the charge pending", ps, err)
	}
	if s, err := e.b.RunStats(ctx, acme, "run-1"); err != nil || s != (lab.RunStats{Charges: 1, ChargedCents: 2500, OutboxEvents: 1}) {
		t.Fatalf("run stats %+v (%v)", s, err)
	}
	// A charge without an event is a direct send's: in the ledger alone.
	direct := e.charge(acme, "k2", "run-1", 100)
	direct.Event = nil
	if c := e.apply(t, direct); c.BalanceCents != 2600 {
		t.Fatalf("balance after a second charge: %d, want 2600", c.BalanceCents)
	}
	e.ledger(t, acme, 2, 1)
}

func applyIsIdempotentByChargeID(t *testing.T, e *env) {
	a := e.charge(acme, "k1", "", 2500)
	first := e.apply(t, a)
	e.clock.Advance(time.Second)
	again := e.apply(t, a)
	if again != first {
		t.Fatalf("applied again: %+v, want the first %+v", again, first)
	}
	e.ledger(t, acme, 1, 1)
	if bal, err := e.b.Balance(t.Context(), "acme", "acct-1"); err != nil || bal != 2500 {
		t.Fatalf("balance %d (%v), want 2500 once", bal, err)
	}
}

func duplicatesAreCountedPerOperation(t *testing.T, e *env) {
	ctx := t.Context()
	first := e.apply(t, e.charge(acme, "k1", "", 100))
	e.clock.Advance(time.Second)
	again := e.apply(t, e.charge(acme, "k1", "", 250)) // the same key charged again: a duplicate
	e.apply(t, e.charge(acme, "", "", 40))             // keyless charges are each their own operation
	e.apply(t, e.charge(acme, "", "", 40))
	e.apply(t, e.charge(globex, "k1", "", 999)) // another namespace's
	if k, err := e.b.KeyCharges(ctx, "acme", "memory", "k1"); err != nil || k.Charges != 2 || k.Cents != 350 || k.FirstCents != 100 ||
		k.OverchargedCents() != 250 || !slices.Equal(k.IDs, []string{first.ID, again.ID}) {
		t.Fatalf("key tally %+v (%v), want 2 charges oldest first, 350 cents, the first 100", k, err)
	}
	sum, err := e.b.Summary(ctx, acme)
	want := lab.StoreSummary{Store: "memory", ChargesApplied: 4, Operations: 3, DuplicatesApplied: 1, AmountCents: 430, OverchargedCents: 250}
	if err != nil || len(sum) != 1 || sum[0] != want {
		t.Fatalf("acme's summary %+v (%v), want %+v", sum, err, want)
	}
	if all, err := e.b.Summary(ctx, ""); err != nil || len(all) != 1 || all[0].ChargesApplied != 5 || all[0].Operations != 4 {
		t.Fatalf("every namespace's summary %+v (%v)", all, err)
	}
	if bal, err := e.b.Balance(ctx, "acme", "acct-1"); err != nil || bal != 430 {
		t.Fatalf("balance %d (%v), want 430", bal, err)
	}
}

func orderIDAppliesOnce(t *testing.T, e *env) {
	first := e.charge(acme, "k1", "", 2500)
	first.Entry.OrderID = "order-1"
	c := e.apply(t, first)
	second := e.charge(acme, "k2", "", 2500) // another key, the same order
	second.Entry.OrderID = "order-1"
	_, err := e.b.Apply(t.Context(), second)
	var conflict *lab.OrderConflictError
	if !errors.As(err, &conflict) || conflict.ChargeID != c.ID || conflict.OrderID != "order-1" {
		t.Fatalf("a second charge of order-1: %v, want an order conflict naming %s", err, c.ID)
	}
	other := e.charge(globex, "k1", "", 2500) // another tenant's order-1 is its own
	other.Entry.OrderID = "order-1"
	e.apply(t, other)
	e.ledger(t, acme, 1, 1)
	e.ledger(t, globex, 1, 1)
}

func outboxFailureKeepsNothing(t *testing.T, e *env) {
	a := e.charge(acme, "k1", "run-1", 2500)
	a.FailOutbox = true
	if _, err := e.b.Apply(t.Context(), a); !errors.Is(err, lab.ErrOutboxWrite) {
		t.Fatalf("Apply with the outbox failing: %v, want lab.ErrOutboxWrite", err)
	}
	e.ledger(t, acme, 0, 0)
	if bal, err := e.b.Balance(t.Context(), "acme", "acct-1"); err != nil || bal != 0 {
		t.Fatalf("balance %d (%v) after a rolled-back charge", bal, err)
	}
	// The same charge, the outbox well again, applies once.
	a.FailOutbox = false
	e.apply(t, a)
	e.ledger(t, acme, 1, 1)
}

func runsBelongToOneNamespace(t *testing.T, e *env) {
	ctx := t.Context()
	must(t, e.b.OpenRun(ctx, acme, "run-1"))
	must(t, e.b.OpenRun(ctx, acme, "run-1")) // opening it again is no error
	if err := e.b.OpenRun(ctx, globex, "run-1"); err == nil {
		t.Fatal("globex opened acme's run")
	}
	if ns, err := e.b.RunNamespace(ctx, "run-1"); err != nil || ns != acme {
		t.Fatalf("run-1 is %q's (%v), want acme's", ns, err)
	}
	if _, err := e.b.RunNamespace(ctx, "run-none"); !errors.Is(err, lab.ErrRunNotFound) {
		t.Fatalf("an unknown run: %v, want lab.ErrRunNotFound", err)
	}
	e.apply(t, e.charge(acme, "k1", "run-1", 100))
	e.apply(t, e.charge(acme, "k2", "run-1", 200))
	e.apply(t, e.charge(globex, "k1", "run-1", 400)) // tagged with acme's run, in globex's namespace
	if s, err := e.b.RunStats(ctx, acme, "run-1"); err != nil || s != (lab.RunStats{Charges: 2, ChargedCents: 300, OutboxEvents: 2}) {
		t.Fatalf("acme's run-1: %+v (%v), want only acme's 2 charges", s, err)
	}
	if s, err := e.b.RunStats(ctx, acme, "run-2"); err != nil || s != (lab.RunStats{}) {
		t.Fatalf("a run with nothing: %+v (%v)", s, err)
	}
}

func claimsAreFenced(t *testing.T, e *env) {
	ctx := t.Context()
	a := e.charge(acme, "k1", "run-1", 2500)
	e.apply(t, a)
	claimed, err := e.b.ClaimDue(ctx, 10, time.Minute)
	if err != nil || len(claimed) != 1 || claimed[0].ID != a.Event.ID || claimed[0].Attempts != 1 || claimed[0].ClaimToken == "" {
		t.Fatalf("claim: %+v (%v), want the event, first attempt, with a token", claimed, err)
	}
	if again, err := e.b.ClaimDue(ctx, 10, time.Minute); err != nil || len(again) != 0 {
		t.Fatalf("a leased event claimed again: %+v (%v)", again, err)
	}
	if st, err := e.b.OutboxStats(ctx, acme); err != nil || st.Pending != 1 || st.InFlight != 1 {
		t.Fatalf("outbox while leased %+v (%v), want 1 pending, in flight", st, err)
	}
	// The lease runs out: another worker claims it, and the first is fenced.
	e.clock.Advance(time.Minute + time.Second)
	second, err := e.b.ClaimDue(ctx, 10, time.Minute)
	if err != nil || len(second) != 1 || second[0].Attempts != 2 || second[0].ClaimToken == claimed[0].ClaimToken {
		t.Fatalf("claim after the lease: %+v (%v), want a second attempt under a new token", second, err)
	}
	if err := e.b.MarkDelivered(ctx, a.Event.ID, claimed[0].ClaimToken); !errors.Is(err, lab.ErrFenced) {
		t.Fatalf("completion under a superseded claim: %v, want lab.ErrFenced", err)
	}
	if err := e.b.MarkFailed(ctx, a.Event.ID, claimed[0].ClaimToken, e.clock.Now(), true, "stale"); !errors.Is(err, lab.ErrFenced) {
		t.Fatalf("failure under a superseded claim: %v, want lab.ErrFenced", err)
	}
	must(t, e.b.MarkDelivered(ctx, a.Event.ID, second[0].ClaimToken))
	if err := e.b.MarkDelivered(ctx, a.Event.ID, second[0].ClaimToken); !errors.Is(err, lab.ErrFenced) {
		t.Fatalf("a delivered event completed again: %v, want lab.ErrFenced", err)
	}
	st, err := e.b.OutboxStats(ctx, acme)
	if err != nil || st.Pending != 0 || st.Delivered != 1 || st.InFlight != 0 || st.Retries != 1 {
		t.Fatalf("outbox %+v (%v), want one delivered after one retry", st, err)
	}
	if s, err := e.b.RunStats(ctx, acme, "run-1"); err != nil || s.Delivered != 1 || s.OutboxEvents != 1 {
		t.Fatalf("run stats %+v (%v), want its event delivered", s, err)
	}
	if ps, err := e.b.Payments(ctx, acme, "", 10); err != nil || len(ps) != 1 || ps[0].Outbox != lab.EventDelivered {
		t.Fatalf("payments %+v (%v), want the event delivered", ps, err)
	}
}

func theBacklogIsWhatIsPending(t *testing.T, e *env) {
	ctx := t.Context()
	first := e.charge(acme, "k1", "run-1", 100)
	e.apply(t, first)
	e.clock.Advance(3 * time.Second)
	second, third := e.charge(acme, "k2", "run-1", 100), e.charge(acme, "k3", "run-1", 100)
	e.apply(t, second)
	e.apply(t, third)
	e.apply(t, e.charge(globex, "k1", "", 100))
	e.clock.Advance(2 * time.Second)
	claimed, err := e.b.ClaimDue(ctx, 10, time.Minute)
	if err != nil || len(claimed) != 4 {
		t.Fatalf("claim: %d events (%v), want 4", len(claimed), err)
	}
	// The oldest is delivered and the third dies: of acme's, the second is
	// left, leased but pending.
	for _, ev := range claimed {
		switch ev.ID {
		case first.Event.ID:
			must(t, e.b.MarkDelivered(ctx, ev.ID, ev.ClaimToken))
		case third.Event.ID:
			must(t, e.b.MarkFailed(ctx, ev.ID, ev.ClaimToken, e.clock.Now(), true, "gave up"))
		}
	}
	for _, c := range []struct {
		ns   lab.Namespace
		want lab.OutboxBacklog
	}{
		{acme, lab.OutboxBacklog{Pending: 1, OldestPendingAge: 2 * time.Second}},
		{globex, lab.OutboxBacklog{Pending: 1, OldestPendingAge: 2 * time.Second}},
		{"", lab.OutboxBacklog{Pending: 2, OldestPendingAge: 2 * time.Second}},
		{"nobody", lab.OutboxBacklog{}},
	} {
		bl, err := e.b.OutboxBacklog(ctx, c.ns)
		if err != nil || bl != c.want {
			t.Errorf("backlog of %q: %+v (%v), want %+v", c.ns, bl, err, c.want)
		}
		st, err := e.b.OutboxStats(ctx, c.ns)
		if err != nil || st.Pending != bl.Pending || st.OldestPendingAge != bl.OldestPendingAge {
			t.Errorf("stats of %q: %+v (%v), want the backlog's pending and age", c.ns, st, err)
		}
	}
}

func failedEventsRetryThenDie(t *testing.T, e *env) {
	ctx := t.Context()
	a := e.charge(acme, "k1", "run-1", 2500)
	e.apply(t, a)
	claim := func() lab.Event {
		t.Helper()
		evs, err := e.b.ClaimDue(ctx, 10, time.Minute)
		if err != nil || len(evs) != 1 {
			t.Fatalf("claim: %+v (%v), want the event", evs, err)
		}
		return evs[0]
	}
	ev := claim()
	must(t, e.b.MarkFailed(ctx, ev.ID, ev.ClaimToken, e.clock.Now().Add(10*time.Second), false, "provider unavailable"))
	if evs, err := e.b.ClaimDue(ctx, 10, time.Minute); err != nil || len(evs) != 0 {
		t.Fatalf("claimed before its next attempt: %+v (%v)", evs, err)
	}
	if evs, err := e.b.Events(ctx, acme, 10); err != nil || len(evs) != 1 || evs[0].LastError != "provider unavailable" || evs[0].State != lab.EventPending {
		t.Fatalf("events %+v (%v), want it pending with its error", evs, err)
	}
	e.clock.Advance(10 * time.Second)
	ev = claim()
	must(t, e.b.MarkFailed(ctx, ev.ID, ev.ClaimToken, e.clock.Now(), true, "gave up"))
	if evs, err := e.b.ClaimDue(ctx, 10, time.Minute); err != nil || len(evs) != 0 {
		t.Fatalf("a dead event claimed: %+v (%v)", evs, err)
	}
	st, err := e.b.OutboxStats(ctx, acme)
	if err != nil || st.Dead != 1 || st.Pending != 0 || st.Retries != 1 {
		t.Fatalf("outbox %+v (%v), want it dead after one retry", st, err)
	}
	if s, err := e.b.RunStats(ctx, acme, "run-1"); err != nil || s.Dead != 1 {
		t.Fatalf("run stats %+v (%v), want its event dead", s, err)
	}
	e.ledger(t, acme, 1, 1) // the charge stays: only its effect failed
}

func requeue(t *testing.T, e *env) {
	ctx := t.Context()
	dead, delivered, leased := e.charge(acme, "k1", "", 100), e.charge(acme, "k2", "", 100), e.charge(acme, "k3", "", 100)
	for _, a := range []lab.Apply{dead, delivered, leased} {
		e.apply(t, a)
	}
	evs, err := e.b.ClaimDue(ctx, 2, time.Minute) // oldest first: dead's and delivered's
	if err != nil || len(evs) != 2 {
		t.Fatalf("claim: %+v (%v)", evs, err)
	}
	byID := map[string]lab.Event{evs[0].ID: evs[0], evs[1].ID: evs[1]}
	must(t, e.b.MarkFailed(ctx, dead.Event.ID, byID[dead.Event.ID].ClaimToken, e.clock.Now(), true, "gave up"))
	must(t, e.b.MarkDelivered(ctx, delivered.Event.ID, byID[delivered.Event.ID].ClaimToken))
	held, err := e.b.ClaimDue(ctx, 1, time.Minute)
	if err != nil || len(held) != 1 || held[0].ID != leased.Event.ID {
		t.Fatalf("claim of the third: %+v (%v)", held, err)
	}

	for _, c := range []struct {
		ns   lab.Namespace
		id   string
		want error
	}{
		{globex, dead.Event.ID, lab.ErrEventNotFound}, // another namespace's
		{acme, "no-such-event", lab.ErrEventNotFound},
		{acme, delivered.Event.ID, lab.ErrEventDelivered},
		{acme, leased.Event.ID, lab.ErrEventInFlight},
	} {
		if _, err := e.b.Requeue(ctx, c.ns, c.id); !errors.Is(err, c.want) {
			t.Errorf("requeue %s as %s: %v, want %v", c.id, c.ns, err, c.want)
		}
	}
	ev, err := e.b.Requeue(ctx, acme, dead.Event.ID)
	if err != nil || ev.State != lab.EventPending || ev.Attempts != 0 || ev.ClaimToken != "" || ev.NextAttempt.After(e.clock.Now()) {
		t.Fatalf("requeued %+v (%v), want it pending, due now, attempts reset", ev, err)
	}
	again, err := e.b.ClaimDue(ctx, 10, time.Minute)
	if err != nil || len(again) != 1 || again[0].ID != dead.Event.ID || again[0].Attempts != 1 {
		t.Fatalf("claim after the requeue: %+v (%v), want the requeued event, first attempt", again, err)
	}
	// A worker that held the leased event is fenced out once it is
	// requeued after its lease.
	e.clock.Advance(2 * time.Minute)
	if _, err := e.b.Requeue(ctx, "", leased.Event.ID); err != nil {
		t.Fatalf("requeue of an event whose lease ended: %v", err)
	}
	if err := e.b.MarkDelivered(ctx, leased.Event.ID, held[0].ClaimToken); !errors.Is(err, lab.ErrFenced) {
		t.Fatalf("completion under a claim from before the requeue: %v, want lab.ErrFenced", err)
	}
}

func resetForgetsOneNamespace(t *testing.T, e *env) {
	ctx := t.Context()
	must(t, e.b.OpenRun(ctx, acme, "run-acme"))
	must(t, e.b.OpenRun(ctx, globex, "run-globex"))
	a := e.apply(t, e.charge(acme, "k1", "run-acme", 100))
	must(t, e.b.RecordCapture(ctx, acme, a.ID, "acme", "cap-1"))
	g := e.apply(t, e.charge(globex, "k1", "run-globex", 200))
	must(t, e.b.RecordCapture(ctx, globex, g.ID, "globex", "cap-2"))
	must(t, e.b.Reset(ctx, acme))
	e.ledger(t, acme, 0, 0)
	e.ledger(t, globex, 1, 1)
	if bal, err := e.b.Balance(ctx, "acme", "acct-1"); err != nil || bal != 0 {
		t.Fatalf("acme's balance after its reset: %d (%v)", bal, err)
	}
	if bal, err := e.b.Balance(ctx, "globex", "acct-1"); err != nil || bal != 200 {
		t.Fatalf("globex's balance after acme's reset: %d (%v), want 200", bal, err)
	}
	if _, err := e.b.RunNamespace(ctx, "run-acme"); !errors.Is(err, lab.ErrRunNotFound) {
		t.Fatalf("acme's run after its reset: %v, want lab.ErrRunNotFound", err)
	}
	if ns, err := e.b.RunNamespace(ctx, "run-globex"); err != nil || ns != globex {
		t.Fatalf("globex's run after acme's reset: %q (%v)", ns, err)
	}
	if ps, err := e.b.Payments(ctx, globex, "", 10); err != nil || len(ps) != 1 || ps[0].CaptureID != "cap-2" {
		t.Fatalf("globex's payments after acme's reset: %+v (%v)", ps, err)
	}
	// The charge's id is free again in acme's namespace.
	e.apply(t, e.charge(acme, "k1", "run-acme", 100))
	e.ledger(t, acme, 1, 1)
	must(t, e.b.Reset(ctx, ""))
	e.ledger(t, "", 0, 0)
}

// webhook is the provider's event of type typ about c's capture.
func webhook(id, typ string, c lab.Charge, tenant, captureID string, at time.Time) lab.Webhook {
	return lab.Webhook{EventID: id, Type: typ, ChargeID: c.ID, Tenant: tenant, ReceivedAt: at,
		CaptureID: captureID, AmountCents: c.AmountCents, Currency: c.Currency}
}

func webhooksMoveMatchingCharges(t *testing.T, e *env) {
	ctx := t.Context()
	c := e.apply(t, e.charge(acme, "k1", "run-1", 2500))
	now := e.clock.Now()
	// Before the lab recorded the capture, a webhook that would move the
	// charge is refused, and records nothing.
	if _, err := e.b.ApplyWebhook(ctx, webhook("evt-early", lab.WebhookCaptureSucceeded, c, "acme", "cap-1", now)); !errors.Is(err, lab.ErrCaptureNotRecorded) {
		t.Fatalf("a webhook before the capture is recorded: %v, want lab.ErrCaptureNotRecorded", err)
	}
	must(t, e.b.RecordCapture(ctx, acme, c.ID, "acme", "cap-1"))
	must(t, e.b.RecordCapture(ctx, acme, c.ID, "acme", "cap-1")) // recording it again changes nothing

	r, err := e.b.ApplyWebhook(ctx, webhook("evt-1", lab.WebhookCaptureSucceeded, c, "acme", "cap-1", now))
	if err != nil || r != (lab.WebhookResult{Before: lab.PaymentPending, After: lab.PaymentSucceeded}) {
		t.Fatalf("the capture's success: %+v (%v), want pending to succeeded", r, err)
	}
	if r, err := e.b.ApplyWebhook(ctx, webhook("evt-1", lab.WebhookCaptureSucceeded, c, "acme", "cap-1", now)); err != nil || !r.Duplicate || r.Changed() {
		t.Fatalf("the same event again: %+v (%v), want a duplicate that moves nothing", r, err)
	}
	if r, err := e.b.ApplyWebhook(ctx, webhook("evt-2", lab.WebhookCaptureProcessing, c, "acme", "cap-1", now)); err != nil || r.Changed() || r.After != lab.PaymentSucceeded {
		t.Fatalf("a late processing event: %+v (%v), want it to move nothing", r, err)
	}
	wrong := webhook("evt-3", lab.WebhookCaptureFailed, c, "acme", "cap-1", now.Add(time.Second))
	wrong.AmountCents = 1
	if r, err := e.b.ApplyWebhook(ctx, wrong); err != nil || r.Mismatch == "" || r.Changed() {
		t.Fatalf("an event of another amount: %+v (%v), want a mismatch that moves nothing", r, err)
	}
	if _, err := e.b.ApplyWebhook(ctx, webhook("evt-4", lab.WebhookCaptureSucceeded, c, "globex", "cap-1", now)); !errors.Is(err, lab.ErrUnknownCharge) {
		t.Fatalf("an event naming another tenant: %v, want lab.ErrUnknownCharge", err)
	}
	if _, err := e.b.ApplyWebhook(ctx, webhook("evt-5", lab.WebhookCaptureSucceeded, lab.Charge{ID: "ch_none", AmountCents: 1, Currency: "USD"}, "acme", "cap-1", now)); !errors.Is(err, lab.ErrUnknownCharge) {
		t.Fatalf("an event naming no charge: %v, want lab.ErrUnknownCharge", err)
	}
	ps, err := e.b.Payments(ctx, acme, "run-1", 10)
	if err != nil || len(ps) != 1 {
		t.Fatalf("payments %+v (%v)", ps, err)
	}
	p := ps[0]
	if p.State != lab.PaymentSucceeded || p.CaptureID != "cap-1" || !p.CapturedAt.Equal(now) || p.Webhooks != 2 || p.Mismatched != 1 || p.Mismatch == "" {
		t.Fatalf("payment %+v, want succeeded, captured as cap-1, 2 webhooks applied, 1 mismatched", p)
	}
	e.ledger(t, acme, 1, 1) // webhooks move payment states, never the ledger
}

// ownCaptureToldByItsWebhook: a webhook about a capture made under the
// relay's own key, arriving before the relay recorded the capture's answer,
// is matched and records the capture; the relay's record of it then
// changes nothing. A webhook under another key still waits for a record.
func ownCaptureToldByItsWebhook(t *testing.T, e *env) {
	ctx := t.Context()
	own := func(w lab.Webhook) lab.Webhook {
		w.CaptureKey = lab.DerivedCaptureKey(w.ChargeID)
		return w
	}
	c := e.apply(t, e.charge(acme, "k1", "run-1", 2500))
	now := e.clock.Now()
	r, err := e.b.ApplyWebhook(ctx, own(webhook("evt-1", lab.WebhookCaptureProcessing, c, "acme", "cap-1", now)))
	if err != nil || r.Changed() || r.Mismatch != "" {
		t.Fatalf("the processing event of the lab's own capture: %+v (%v), want it recorded, moving nothing", r, err)
	}
	e.clock.Advance(2 * time.Minute)
	if d, err := e.b.OldestStuck(ctx, time.Minute); err != nil || d != 2*time.Minute {
		t.Fatalf("oldest stuck with the capture recorded by its webhook: %s (%v), want 2m0s", d, err)
	}
	r, err = e.b.ApplyWebhook(ctx, own(webhook("evt-2", lab.WebhookCaptureSucceeded, c, "acme", "cap-1", e.clock.Now())))
	if err != nil || r != (lab.WebhookResult{Before: lab.PaymentPending, After: lab.PaymentSucceeded}) {
		t.Fatalf("the success of the lab's own capture: %+v (%v), want pending to succeeded", r, err)
	}
	must(t, e.b.RecordCapture(ctx, acme, c.ID, "acme", "cap-1")) // the relay's answer, late
	if d, err := e.b.OldestStuck(ctx, time.Minute); err != nil || d != 0 {
		t.Fatalf("oldest stuck once settled: %s (%v)", d, err)
	}
	// The final event first (the provider reordered them): it records the
	// capture settled, as the charge moves.
	reordered := e.apply(t, e.charge(acme, "k2", "run-1", 2500))
	if r, err := e.b.ApplyWebhook(ctx, own(webhook("evt-3", lab.WebhookCaptureSucceeded, reordered, "acme", "cap-2", e.clock.Now()))); err != nil || !r.Changed() {
		t.Fatalf("the final event first: %+v (%v), want it to move the charge", r, err)
	}
	// Another key is not the lab's: that webhook waits for a record.
	other := e.apply(t, e.charge(acme, "k3", "run-1", 2500))
	stray := webhook("evt-4", lab.WebhookCaptureFailed, other, "acme", "cap-3", e.clock.Now())
	stray.CaptureKey = "rnd_1"
	if _, err := e.b.ApplyWebhook(ctx, stray); !errors.Is(err, lab.ErrCaptureNotRecorded) {
		t.Fatalf("a webhook under another key before any record: %v, want lab.ErrCaptureNotRecorded", err)
	}
	e.clock.Advance(2 * time.Minute)
	if d, err := e.b.OldestStuck(ctx, time.Minute); err != nil || d != 0 {
		t.Fatalf("oldest stuck: %s (%v), want none: both captures settled, the stray one never recorded", d, err)
	}
	ps, err := e.b.Payments(ctx, acme, "run-1", 10)
	if err != nil || len(ps) != 3 {
		t.Fatalf("payments %+v (%v)", ps, err)
	}
	for _, p := range ps {
		want := map[string]string{c.ID: "cap-1", reordered.ID: "cap-2", other.ID: ""}[p.ChargeID]
		state := lab.PaymentSucceeded
		if want == "" {
			state = lab.PaymentPending
		}
		if p.CaptureID != want || p.State != state || p.Mismatched != 0 {
			t.Fatalf("payment %+v, want captured as %q, %s, no mismatch", p, want, state)
		}
	}
}

func stuckChargeAges(t *testing.T, e *env) {
	ctx := t.Context()
	c := e.apply(t, e.charge(acme, "k1", "", 2500))
	if d, err := e.b.OldestStuck(ctx, time.Minute); err != nil || d != 0 {
		t.Fatalf("oldest stuck before any capture: %s (%v)", d, err)
	}
	must(t, e.b.RecordCapture(ctx, acme, c.ID, "acme", "cap-1"))
	e.clock.Advance(30 * time.Second)
	if d, err := e.b.OldestStuck(ctx, time.Minute); err != nil || d != 0 {
		t.Fatalf("oldest stuck within the bound: %s (%v)", d, err)
	}
	e.clock.Advance(60 * time.Second)
	if d, err := e.b.OldestStuck(ctx, time.Minute); err != nil || d != 90*time.Second {
		t.Fatalf("oldest stuck past the bound: %s (%v), want 1m30s", d, err)
	}
	if _, err := e.b.ApplyWebhook(ctx, webhook("evt-1", lab.WebhookCaptureSucceeded, c, "acme", "cap-1", e.clock.Now())); err != nil {
		t.Fatal(err)
	}
	if d, err := e.b.OldestStuck(ctx, time.Minute); err != nil || d != 0 {
		t.Fatalf("oldest stuck once it settled: %s (%v)", d, err)
	}
}

// pruned is what pruning must leave as it was: the counts, the ledger and
// what reconcile reads of each charge.
type pruned struct {
	outbox, all lab.OutboxStats
	run         lab.RunStats
	summary     []lab.StoreSummary
	payments    map[string]lab.Payment // Outbox left out: a pruned event reads as none
}

func (e *env) prunedFigures(t *testing.T) pruned {
	t.Helper()
	ctx := t.Context()
	var f pruned
	var err error
	if f.outbox, err = e.b.OutboxStats(ctx, acme); err != nil {
		t.Fatal(err)
	}
	if f.all, err = e.b.OutboxStats(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if f.run, err = e.b.RunStats(ctx, acme, "run-1"); err != nil {
		t.Fatal(err)
	}
	if f.summary, err = e.b.Summary(ctx, acme); err != nil {
		t.Fatal(err)
	}
	ps, err := e.b.Payments(ctx, acme, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	f.payments = map[string]lab.Payment{}
	for _, p := range ps {
		p.Outbox, p.Webhooks = "", 0
		f.payments[p.ChargeID] = p
	}
	return f
}

func pruningKeepsTheTotals(t *testing.T, e *env) {
	ctx := t.Context()
	// At t0 seven charges: acme's 0..5 in run-1, globex's one. Their
	// events are claimed; 1, 2 and globex's are delivered, 0 fails, 5 dies.
	var as []lab.Apply
	for i := range 6 {
		as = append(as, e.charge(acme, "k"+strconv.Itoa(i), "run-1", int64(100+i)))
	}
	g := e.charge(globex, "g1", "run-g", 100)
	cs := map[string]lab.Charge{}
	for _, a := range append(as, g) {
		cs[a.Entry.ChargeID] = e.apply(t, a)
	}
	t0 := e.clock.Now()
	claimed, err := e.b.ClaimDue(ctx, 10, time.Minute)
	if err != nil || len(claimed) != 7 {
		t.Fatalf("claim: %d events (%v), want 7", len(claimed), err)
	}
	token := map[string]string{}
	for _, ev := range claimed {
		token[ev.ID] = ev.ClaimToken
	}
	deliver := func(a lab.Apply) { t.Helper(); must(t, e.b.MarkDelivered(ctx, a.Event.ID, token[a.Event.ID])) }
	deliver(as[1])
	deliver(as[2])
	deliver(g)
	must(t, e.b.MarkFailed(ctx, as[0].Event.ID, token[as[0].Event.ID], t0.Add(time.Hour), false, "provider unavailable"))
	must(t, e.b.MarkFailed(ctx, as[5].Event.ID, token[as[5].Event.ID], t0, true, "gave up"))
	// Two webhooks at t0: one moves charge 1, one of charge 2 mismatches.
	c1, c2 := cs[as[1].Entry.ChargeID], cs[as[2].Entry.ChargeID]
	must(t, e.b.RecordCapture(ctx, acme, c1.ID, "acme", "cap-1"))
	must(t, e.b.RecordCapture(ctx, acme, c2.ID, "acme", "cap-2"))
	if _, err := e.b.ApplyWebhook(ctx, webhook("evt-1", lab.WebhookCaptureSucceeded, c1, "acme", "cap-1", t0)); err != nil {
		t.Fatal(err)
	}
	wrong := webhook("evt-2", lab.WebhookCaptureSucceeded, c2, "acme", "cap-2", t0)
	wrong.AmountCents++
	if r, err := e.b.ApplyWebhook(ctx, wrong); err != nil || r.Mismatch == "" {
		t.Fatalf("the mismatched webhook: %+v (%v)", r, err)
	}

	// An hour on (t1): 0 is retried, 3 and 4 claimed again after their
	// lease; all three are delivered on their second attempt. A webhook
	// of charge 3, and a seventh charge whose event waits.
	e.clock.Advance(time.Hour)
	t1 := e.clock.Now()
	again, err := e.b.ClaimDue(ctx, 10, time.Minute)
	if err != nil || len(again) != 3 {
		t.Fatalf("second claim: %d events (%v), want 0, 3 and 4", len(again), err)
	}
	for _, ev := range again {
		must(t, e.b.MarkDelivered(ctx, ev.ID, ev.ClaimToken))
	}
	c3 := cs[as[3].Entry.ChargeID]
	must(t, e.b.RecordCapture(ctx, acme, c3.ID, "acme", "cap-3"))
	if _, err := e.b.ApplyWebhook(ctx, webhook("evt-3", lab.WebhookCaptureSucceeded, c3, "acme", "cap-3", t1)); err != nil {
		t.Fatal(err)
	}
	waiting := e.charge(acme, "k6", "run-1", 106)
	e.apply(t, waiting)

	before := e.prunedFigures(t)
	if before.outbox != (lab.OutboxStats{Pending: 1, Delivered: 5, Dead: 1, Retries: 3}) {
		t.Fatalf("acme's outbox before pruning %+v", before.outbox)
	}
	// Half an hour on, with a retention of half an hour: only what was
	// delivered or received at t0 is older than it.
	e.clock.Advance(30 * time.Minute)
	cutoff := e.clock.Now().Add(-30 * time.Minute)
	if calls := labtest.PruneInBatches(t, e.b.PruneDelivered, cutoff, 2); !slices.Equal(calls, []int{2, 1}) {
		t.Fatalf("pruning delivered events two at a time deleted %v, want [2 1]: 1, 2 and globex's", calls)
	}
	if calls := labtest.PruneInBatches(t, e.b.PruneWebhookEvents, cutoff, 10); !slices.Equal(calls, []int{1}) {
		t.Fatalf("pruning webhook events deleted %v, want [1]: evt-1 (evt-2 mismatched, evt-3 is younger)", calls)
	}
	after := e.prunedFigures(t)
	after.outbox.OldestPendingAge, before.outbox.OldestPendingAge = 0, 0
	after.all.OldestPendingAge, before.all.OldestPendingAge = 0, 0
	if after.outbox != before.outbox || after.all != before.all || after.run != before.run {
		t.Fatalf("pruning moved the counts: acme %+v → %+v, all %+v → %+v, run %+v → %+v",
			before.outbox, after.outbox, before.all, after.all, before.run, after.run)
	}
	if !slices.Equal(after.summary, before.summary) || len(after.payments) != 7 {
		t.Fatalf("pruning touched the ledger: %+v → %+v, %d charges", before.summary, after.summary, len(after.payments))
	}
	for id, p := range before.payments {
		if after.payments[id] != p {
			t.Errorf("charge %s read by reconcile: %+v → %+v", id, p, after.payments[id])
		}
	}
	evs, err := e.b.Events(ctx, acme, 10)
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]string{}
	for _, ev := range evs {
		left[ev.ID] = ev.State
	}
	want := map[string]string{as[0].Event.ID: lab.EventDelivered, as[3].Event.ID: lab.EventDelivered, as[4].Event.ID: lab.EventDelivered,
		as[5].Event.ID: lab.EventDead, waiting.Event.ID: lab.EventPending}
	if !maps.Equal(left, want) {
		t.Fatalf("events left %v, want %v", left, want)
	}
	// Within the window, a redelivered webhook is still a duplicate.
	if r, err := e.b.ApplyWebhook(ctx, webhook("evt-3", lab.WebhookCaptureSucceeded, c3, "acme", "cap-3", e.clock.Now())); err != nil || !r.Duplicate {
		t.Fatalf("evt-3 redelivered: %+v (%v), want a duplicate", r, err)
	}

	// Much later everything delivered goes; the dead and the pending
	// events stay, and the counts hold.
	e.clock.Advance(24 * time.Hour)
	if calls := labtest.PruneInBatches(t, e.b.PruneDelivered, e.clock.Now(), 1000); !slices.Equal(calls, []int{3}) {
		t.Fatalf("the second pass deleted %v, want [3]", calls)
	}
	later := e.prunedFigures(t)
	later.outbox.OldestPendingAge, later.all.OldestPendingAge = 0, 0
	if later.outbox != before.outbox || later.all != before.all || later.run != before.run {
		t.Fatalf("the second pass moved the counts: %+v → %+v, %+v → %+v", before.outbox, later.outbox, before.run, later.run)
	}
	if evs, err := e.b.Events(ctx, acme, 10); err != nil || len(evs) != 2 {
		t.Fatalf("events left %+v (%v), want the dead one and the pending one", evs, err)
	}
	if _, err := e.b.Requeue(ctx, acme, as[5].Event.ID); err != nil {
		t.Fatalf("the dead event, re-queued after pruning: %v", err)
	}

	// A reset forgets the namespace's roll-up, and only its own.
	must(t, e.b.Reset(ctx, acme))
	if st, err := e.b.OutboxStats(ctx, acme); err != nil || st != (lab.OutboxStats{}) {
		t.Fatalf("acme's outbox after its reset %+v (%v), want nothing", st, err)
	}
	if s, err := e.b.RunStats(ctx, acme, "run-1"); err != nil || s != (lab.RunStats{}) {
		t.Fatalf("acme's run after its reset %+v (%v), want nothing", s, err)
	}
	if st, err := e.b.OutboxStats(ctx, globex); err != nil || st.Delivered != 1 {
		t.Fatalf("globex's outbox after acme's reset %+v (%v), want its pruned delivery", st, err)
	}
	must(t, e.b.Reset(ctx, ""))
	if st, err := e.b.OutboxStats(ctx, ""); err != nil || st != (lab.OutboxStats{}) {
		t.Fatalf("the outbox after a reset of everything %+v (%v)", st, err)
	}
}
