package pgdb_test

import (
	"context"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/reconcile"
)

// TestReconcileAfterPruning: pruning keeps what reconcile compares (the
// charges, the captures of both sides, the webhooks that did not match), so
// a reconcile long after the retention finds what it found before: no
// pruned row turns into a "never captured" finding, and no finding is lost.
func TestReconcileAfterPruning(t *testing.T) {
	t.Parallel()
	pools, _ := providerPools(t, 1)
	ctx := t.Context()
	clock := labtest.NewClock(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	books, records := pgdb.NewBooks(pools[0], clock.Now), pgdb.NewProviderRecords(pools[0])
	// ok is captured once and settled; twice is captured under two keys;
	// dead's event died before any capture; wrong heard a mismatched webhook.
	apply := func(key string) lab.Charge {
		e := lab.Entry{ChargeID: lab.NewChargeID(), Namespace: "acme", Tenant: "acme", Account: "acct-1", AmountCents: 500,
			Currency: "USD", Key: key, Store: "postgres", Run: "run-1", CreatedAt: clock.Now()}
		c, err := books.Apply(ctx, lab.Apply{Entry: e, Event: lab.NewReceiptEvent(e, lab.Faults{})})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ok, twice, dead, wrong := apply("ok"), apply("twice"), apply("dead"), apply("wrong")
	claimed, err := books.ClaimDue(ctx, 10, time.Minute)
	if err != nil || len(claimed) != 4 {
		t.Fatalf("claim: %d (%v)", len(claimed), err)
	}
	for _, ev := range claimed {
		if ev.ChargeID == dead.ID {
			err = books.MarkFailed(ctx, ev.ID, ev.ClaimToken, clock.Now(), true, "gave up")
		} else {
			err = books.MarkDelivered(ctx, ev.ID, ev.ClaimToken)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	capture := func(c lab.Charge, key string, cents int64) provider.Capture {
		req := provider.CaptureRequest{ChargeID: c.ID, Namespace: "acme", Tenant: "acme", Run: "run-1", AmountCents: cents, Currency: "USD", Via: provider.ViaOutbox}
		pc := provider.Capture{ID: "cap_" + key, Key: key, ChargeID: c.ID, Namespace: "acme", Tenant: "acme", Run: "run-1", AmountCents: cents,
			Currency: "USD", Via: provider.ViaOutbox, Status: provider.StatusSucceeded, Fingerprint: req.Fingerprint(), CreatedAt: clock.Now()}
		if _, err := records.Capture(ctx, pc, hooks(pc, 1, clock.Now(), 10*time.Minute), nil); err != nil {
			t.Fatal(err)
		}
		if err := books.RecordCapture(ctx, "acme", c.ID, "acme", pc.ID); err != nil {
			t.Fatal(err)
		}
		return pc
	}
	for _, pc := range []provider.Capture{capture(ok, "k-ok", 500), capture(twice, "k-twice-1", 500), capture(twice, "k-twice-2", 500), capture(wrong, "k-wrong", 500)} {
		w := lab.Webhook{EventID: "evt_" + pc.Key, Type: lab.WebhookCaptureSucceeded, ChargeID: pc.ChargeID, Tenant: "acme",
			ReceivedAt: clock.Now(), CaptureID: pc.ID, AmountCents: pc.AmountCents, Currency: "USD"}
		if pc.ChargeID == wrong.ID {
			w.AmountCents = 1
		}
		if _, err := books.ApplyWebhook(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	claimedHooks, err := records.ClaimWebhooks(ctx, clock.Now(), 10, time.Minute)
	if err != nil || len(claimedHooks) != 4 {
		t.Fatalf("claim webhooks: %d (%v)", len(claimedHooks), err)
	}
	for _, w := range claimedHooks {
		if err := records.WebhookDelivered(ctx, w, clock.Now(), 200); err != nil {
			t.Fatal(err)
		}
	}
	check := func() map[string]string {
		t.Helper()
		ps, err := books.Payments(ctx, "acme", "", 100)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := records.Captures(ctx, provider.Filter{Namespace: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		rep := reconcile.Compare(ps, cs, false, false)
		found := map[string]string{"agree": strconv.Itoa(rep.Agree), "pending": strconv.Itoa(rep.Pending)}
		for _, f := range rep.Findings {
			found[f.ChargeID] = f.Problem
		}
		return found
	}
	before := check()
	want := map[string]string{"agree": "1", "pending": "0", twice.ID: reconcile.CapturedTwice, dead.ID: reconcile.NeverCaptured, wrong.ID: reconcile.WebhookMismatch}
	if !maps.Equal(before, want) {
		t.Fatalf("reconcile before pruning: %v, want %v", before, want)
	}
	clock.Advance(48 * time.Hour)
	cutoff := clock.Now().Add(-24 * time.Hour)
	for _, f := range []func(context.Context, time.Time, int) (int, error){books.PruneDelivered, books.PruneWebhookEvents, records.PruneWebhooks, records.PruneReceipts} {
		labtest.PruneInBatches(t, f, cutoff, 1000)
	}
	var left int
	if err := pools[0].QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox WHERE state = 'delivered') + (SELECT count(*) FROM provider_webhooks WHERE state = 'delivered')`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d delivered rows left (%v), want the pruner to have taken them all", left, err)
	}
	if after := check(); !maps.Equal(after, before) {
		t.Fatalf("reconcile after pruning: %v, want what it found before: %v", after, before)
	}
}
