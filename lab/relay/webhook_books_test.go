package relay_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// payments is what webhook processing uses of the books.
type payments interface {
	lab.CaptureRecorder
	ApplyWebhook(ctx context.Context, w lab.Webhook) (lab.WebhookResult, error)
	Payments(ctx context.Context, ns lab.Namespace, run string, limit int) ([]lab.Payment, error)
}

// paymentOf reads one charge's payment from the books.
func paymentOf(t *testing.T, p payments, chargeID string) lab.Payment {
	t.Helper()
	ps, err := p.Payments(t.Context(), "acme", "run-relay", 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ps {
		if x.ChargeID == chargeID {
			return x
		}
	}
	t.Fatalf("charge %s not listed", chargeID)
	return lab.Payment{}
}

// recordCapture records the lab's capture of a charge, as the relay does
// with the provider's answer, and returns its id.
func recordCapture(t *testing.T, p payments, chargeID string) string {
	t.Helper()
	id := "cap_" + chargeID
	for range 2 { // twice: the second changes nothing
		if err := p.RecordCapture(t.Context(), "acme", chargeID, "acme", id); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

// TestWebhooksMoveChargesOnce sends each charge's webhooks duplicated, out
// of order and concurrently: every event is applied once, the final state
// is the one the state machine allows, and an unknown charge records
// nothing.
func TestWebhooksMoveChargesOnce(t *testing.T) {
	all, c := setup(t)
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			p := b.(payments)
			ctx := t.Context()
			state := func(chargeID string) lab.Payment { return paymentOf(t, p, chargeID) }
			hook := func(id, typ, chargeID string) lab.Webhook {
				return lab.Webhook{EventID: name + id, Type: typ, ChargeID: chargeID, Tenant: "acme", ReceivedAt: c.Now(),
					CaptureID: "cap_" + chargeID, AmountCents: 100, Currency: "USD"}
			}

			// Out of order: succeeded first, the late processing event changes nothing.
			ok := charge(t, b, c, "wh-ok")
			if got := state(ok.ChargeID); got.State != lab.PaymentPending || got.Webhooks != 0 || got.CaptureID != "" {
				t.Fatalf("a new charge: %+v, want pending with no webhooks and no capture", got)
			}
			if id := recordCapture(t, p, ok.ChargeID); state(ok.ChargeID).CaptureID != id {
				t.Fatalf("after recording capture %s: %+v", id, state(ok.ChargeID))
			}
			for _, w := range []lab.Webhook{hook("e2", lab.WebhookCaptureSucceeded, ok.ChargeID), hook("e1", lab.WebhookCaptureProcessing, ok.ChargeID)} {
				if _, err := p.ApplyWebhook(ctx, w); err != nil {
					t.Fatal(err)
				}
			}
			// Sixteen copies of one event at once: one applies, fifteen are duplicates.
			failed := charge(t, b, c, "wh-failed")
			recordCapture(t, p, failed.ChargeID)
			var wg sync.WaitGroup
			outcomes := make(chan string, 16)
			release := make(chan struct{})
			for range 16 {
				wg.Go(func() {
					<-release
					res, err := p.ApplyWebhook(ctx, hook("e3", lab.WebhookCaptureFailed, failed.ChargeID))
					if err != nil {
						t.Error(err)
					}
					outcomes <- res.Outcome()
				})
			}
			close(release)
			wg.Wait()
			close(outcomes)
			count := map[string]int{}
			for o := range outcomes {
				count[o]++
			}
			if count[lab.WebhookApplied] != 1 || count[lab.WebhookDuplicate] != 15 {
				t.Fatalf("16 copies of one event: %v, want 1 applied and 15 duplicates", count)
			}
			// failed never becomes succeeded.
			res, err := p.ApplyWebhook(ctx, hook("e4", lab.WebhookCaptureSucceeded, failed.ChargeID))
			if err != nil || res.Outcome() != lab.WebhookIgnored {
				t.Fatalf("succeeded after failed: %+v, %v; want ignored", res, err)
			}
			// An unknown charge records nothing; once the charge exists the same event applies.
			if _, err := p.ApplyWebhook(ctx, hook("e5", lab.WebhookCaptureSucceeded, "ch_missing")); !errors.Is(err, lab.ErrUnknownCharge) {
				t.Fatalf("unknown charge: %v", err)
			}
			// Another tenant cannot move acme's charge.
			other := hook("e6", lab.WebhookCaptureFailed, ok.ChargeID)
			other.Tenant = "globex"
			if _, err := p.ApplyWebhook(ctx, other); !errors.Is(err, lab.ErrUnknownCharge) {
				t.Fatalf("another tenant's webhook: %v", err)
			}

			if got := state(ok.ChargeID); got.State != lab.PaymentSucceeded || got.Webhooks != 2 {
				t.Fatalf("out of order: %+v, want succeeded with 2 webhooks recorded", got)
			}
			if got := state(failed.ChargeID); got.State != lab.PaymentFailed || got.Webhooks != 2 {
				t.Fatalf("duplicates: %+v, want failed with 2 distinct webhooks recorded", got)
			}
		})
	}
}

// TestWebhooksMatchTheirCharge: a verified webhook moves a charge only when
// it is about the lab's own capture of it, for its amount and currency.
// The attacks of finding 2 — a 1-cent capture's "succeeded" for a
// 1,000,000-cent charge, a declined capture's "failed" sent ahead of the
// relay — are recorded as mismatches or refused until the relay's capture
// is recorded, and change nothing; the relay's own capture then pays it.
func TestWebhooksMatchTheirCharge(t *testing.T) {
	all, c := setup(t)
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			p := b.(payments)
			ctx := t.Context()
			ev := chargeCents(t, b, c, "wh-match", 1_000_000)
			hook := func(id, typ, captureID string, cents int64, currency string) lab.Webhook {
				c.Advance(time.Second) // each arrives after the one before
				return lab.Webhook{EventID: name + id, Type: typ, ChargeID: ev.ChargeID, Tenant: "acme", ReceivedAt: c.Now(),
					CaptureID: captureID, AmountCents: cents, Currency: currency}
			}
			apply := func(w lab.Webhook, want string) lab.WebhookResult {
				t.Helper()
				res, err := p.ApplyWebhook(ctx, w)
				if err != nil || res.Outcome() != want {
					t.Fatalf("%s %s of %s for %d %s: %+v, %v; want %s", w.EventID, w.Type, w.CaptureID, w.AmountCents, w.Currency, res, err, want)
				}
				return res
			}
			pending := func(webhooks, mismatched int) {
				t.Helper()
				if got := paymentOf(t, p, ev.ChargeID); got.State != lab.PaymentPending || got.Webhooks != webhooks || got.Mismatched != mismatched {
					t.Fatalf("payment %+v; want pending, %d webhooks matched, %d mismatched", got, webhooks, mismatched)
				}
			}
			// Before the relay recorded any capture: a declined capture's
			// "failed", for the right amount, records nothing (the provider
			// retries it); its "processing" moves nothing either way.
			if _, err := p.ApplyWebhook(ctx, hook("e1", lab.WebhookCaptureFailed, "cap_attacker", 1_000_000, "USD")); !errors.Is(err, lab.ErrCaptureNotRecorded) {
				t.Fatalf("failed before any capture was recorded: %v, want ErrCaptureNotRecorded", err)
			}
			apply(hook("e2", lab.WebhookCaptureProcessing, "cap_attacker", 1_000_000, "USD"), lab.WebhookIgnored)
			pending(1, 0)
			// A 1-cent capture's "succeeded", or another currency's: recorded
			// as mismatches, the charge stays pending; a redelivery is a duplicate.
			res := apply(hook("e3", lab.WebhookCaptureSucceeded, "cap_cent", 1, "USD"), lab.WebhookMismatch)
			if res.After != lab.PaymentPending || !strings.Contains(res.Mismatch, "1 USD") {
				t.Fatalf("1-cent webhook: %+v", res)
			}
			apply(hook("e3", lab.WebhookCaptureSucceeded, "cap_cent", 1, "USD"), lab.WebhookDuplicate)
			apply(hook("e4", lab.WebhookCaptureSucceeded, "cap_eur", 1_000_000, "EUR"), lab.WebhookMismatch)
			pending(1, 2)
			// The relay records its capture; the attacker's "failed" is now a
			// mismatch, and the relay's capture's "succeeded" pays the charge.
			relayed := recordCapture(t, p, ev.ChargeID)
			apply(hook("e1", lab.WebhookCaptureFailed, "cap_attacker", 1_000_000, "USD"), lab.WebhookMismatch)
			pending(1, 3)
			apply(hook("e5", lab.WebhookCaptureSucceeded, relayed, 1_000_000, "USD"), lab.WebhookApplied)
			got := paymentOf(t, p, ev.ChargeID)
			if got.State != lab.PaymentSucceeded || got.CaptureID != relayed || got.CapturedAt.IsZero() || got.Mismatched != 3 ||
				!strings.Contains(got.Mismatch, "cap_attacker") {
				t.Fatalf("after the relay's capture: %+v", got)
			}
			// Once paid, a mismatch still moves nothing.
			apply(hook("e6", lab.WebhookCaptureFailed, "cap_attacker", 1, "USD"), lab.WebhookMismatch)
			if got := paymentOf(t, p, ev.ChargeID); got.State != lab.PaymentSucceeded {
				t.Fatalf("a mismatch moved a paid charge: %+v", got)
			}
		})
	}
}

// TestOldestStuck: a charge captured and still pending past the bound is
// stuck, its age counted from the capture; paid, it is no longer.
func TestOldestStuck(t *testing.T) {
	all, c := setup(t)
	for name, b := range all {
		t.Run(name, func(t *testing.T) {
			p := b.(interface {
				payments
				OldestStuck(ctx context.Context, after time.Duration) (time.Duration, error)
			})
			ctx := t.Context()
			stuck := func(want time.Duration) {
				t.Helper()
				if got, err := p.OldestStuck(ctx, 2*time.Minute); err != nil || got != want {
					t.Fatalf("OldestStuck = %s, %v; want %s", got, err, want)
				}
			}
			stuck(0)
			ev := charge(t, b, c, "stuck-"+name)
			charge(t, b, c, "never-captured-"+name) // no capture: the outbox's to report, not this gauge's
			id := recordCapture(t, p, ev.ChargeID)
			if err := p.RecordCapture(ctx, "acme", "ch_rolled_back_"+name, "acme", "cap_x"); err != nil { // a direct send whose charge rolled back
				t.Fatal(err)
			}
			c.Advance(time.Minute)
			stuck(0) // within the bound
			c.Advance(2 * time.Minute)
			stuck(3 * time.Minute)
			if _, err := p.ApplyWebhook(ctx, lab.Webhook{EventID: "evt-stuck-" + name, Type: lab.WebhookCaptureSucceeded, ChargeID: ev.ChargeID,
				Tenant: "acme", ReceivedAt: c.Now(), CaptureID: id, AmountCents: 100, Currency: "USD"}); err != nil {
				t.Fatal(err)
			}
			stuck(0)
		})
	}
}
