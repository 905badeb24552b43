package reconcile_test

import (
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/reconcile"
)

func TestCompare(t *testing.T) {
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	pay := func(id, state, outbox string) lab.Payment {
		return lab.Payment{ChargeID: id, AmountCents: 2500, Currency: "USD", State: state, Outbox: outbox, CreatedAt: at}
	}
	capture := func(id, status string, cents int64) provider.Capture {
		return provider.Capture{ChargeID: id, AmountCents: cents, Currency: "USD", Status: status, CreatedAt: at}
	}
	// A 1-cent webhook for a 2,500-cent charge, refused by the books.
	mismatched := pay("mismatched", lab.PaymentPending, lab.EventDelivered)
	mismatched.Mismatched, mismatched.Mismatch = 1, "the webhook is for 1 USD; the charge is 2500 USD"
	payments := []lab.Payment{
		pay("ok", lab.PaymentSucceeded, lab.EventDelivered),
		pay("declined", lab.PaymentFailed, lab.EventDelivered),
		pay("twice", lab.PaymentSucceeded, lab.EventDelivered),
		pay("in-flight", lab.PaymentPending, lab.EventPending),
		pay("dead", lab.PaymentPending, lab.EventDead),
		pay("direct-lost", lab.PaymentPending, ""),
		pay("amount", lab.PaymentSucceeded, lab.EventDelivered),
		pay("awaiting", lab.PaymentPending, lab.EventDelivered),
		pay("contradicts", lab.PaymentSucceeded, lab.EventDelivered),
		mismatched,
	}
	captures := []provider.Capture{
		capture("ok", "succeeded", 2500), capture("declined", "failed", 2500),
		capture("twice", "succeeded", 2500), capture("twice", "succeeded", 2500),
		capture("amount", "succeeded", 9999), capture("awaiting", "succeeded", 2500),
		capture("contradicts", "failed", 2500), capture("reverted", "succeeded", 2500),
		capture("mismatched", "succeeded", 2500),
	}
	rep := reconcile.Compare(payments, captures, false, false)
	want := map[string]string{
		"twice": reconcile.CapturedTwice, "in-flight": reconcile.InFlight, "dead": reconcile.NeverCaptured,
		"direct-lost": reconcile.NeverCaptured, "amount": reconcile.AmountMismatch, "awaiting": reconcile.AwaitingWebhook,
		"contradicts": reconcile.StateMismatch, "reverted": reconcile.NotInLedger, "mismatched": reconcile.WebhookMismatch,
	}
	got := map[string]string{}
	for _, f := range rep.Findings {
		got[f.ChargeID] = f.Problem
	}
	for id, problem := range want {
		if got[id] != problem {
			t.Errorf("%s: %q, want %q", id, got[id], problem)
		}
	}
	if len(got) != len(want) || rep.Agree != 2 || rep.Pending != 2 || rep.Disagree != 7 || rep.ChargesChecked != 10 || rep.CapturesChecked != 9 {
		t.Fatalf("report %+v", rep)
	}
	// Past the bound, the charge awaiting its webhook is stuck: a
	// disagreement, no longer settling.
	rep = reconcile.CompareWithin(payments, captures, false, false, reconcile.Bounds{Now: at.Add(3 * time.Minute), StuckAfter: 2 * time.Minute})
	for _, f := range rep.Findings {
		if f.ChargeID == "awaiting" && f.Problem != reconcile.Stuck {
			t.Fatalf("awaiting, 3 minutes after its capture: %s, want stuck", f.Problem)
		}
	}
	if rep.Pending != 1 || rep.Disagree != 8 {
		t.Fatalf("with a 2-minute bound, 3 minutes on: %+v", rep)
	}
	if rep := reconcile.CompareWithin(payments, captures, false, false, reconcile.Bounds{Now: at.Add(time.Minute), StuckAfter: 2 * time.Minute}); rep.Pending != 2 {
		t.Fatalf("a minute after the captures, within the bound: %+v", rep)
	}
	// A capture older than a truncated ledger list is not judged.
	old := capture("older", "succeeded", 2500)
	old.CreatedAt = at.Add(-time.Hour)
	if rep := reconcile.Compare(payments[:1], []provider.Capture{capture("ok", "succeeded", 2500), old}, true, false); rep.Disagree != 0 {
		t.Fatalf("truncated: %+v", rep.Findings)
	}
	// A charge older than every capture read, when the captures were cut:
	// its capture may be beyond the limit, so it is not called uncaptured.
	older := pay("older", lab.PaymentSucceeded, lab.EventDelivered)
	older.CreatedAt = at.Add(-time.Hour)
	if rep := reconcile.Compare([]lab.Payment{older, payments[0]}, []provider.Capture{capture("ok", "succeeded", 2500)}, false, true); rep.Disagree != 0 || rep.Unchecked != 1 || rep.Agree != 1 {
		t.Fatalf("captures cut: %+v", rep)
	}
}
