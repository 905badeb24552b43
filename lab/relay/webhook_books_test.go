package relay_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/idempotency-lab/lab/lab"
)

// payments is what webhook processing uses of the books.
type payments interface {
	ApplyWebhook(ctx context.Context, w lab.Webhook) (lab.WebhookResult, error)
	Payments(ctx context.Context, ns lab.Namespace, run string, limit int) ([]lab.Payment, error)
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
			state := func(chargeID string) lab.Payment {
				t.Helper()
				ps, err := p.Payments(ctx, "acme", "run-relay", 100)
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
			hook := func(id, typ, chargeID string) lab.Webhook {
				return lab.Webhook{EventID: name + id, Type: typ, ChargeID: chargeID, Tenant: "acme", ReceivedAt: c.Now()}
			}

			// Out of order: succeeded first, the late processing event changes nothing.
			ok := charge(t, b, c, "wh-ok")
			if got := state(ok.ChargeID); got.State != lab.PaymentPending || got.Webhooks != 0 {
				t.Fatalf("a new charge: %+v, want pending with no webhooks", got)
			}
			for _, w := range []lab.Webhook{hook("e2", lab.WebhookCaptureSucceeded, ok.ChargeID), hook("e1", lab.WebhookCaptureProcessing, ok.ChargeID)} {
				if _, err := p.ApplyWebhook(ctx, w); err != nil {
					t.Fatal(err)
				}
			}
			// Sixteen copies of one event at once: one applies, fifteen are duplicates.
			failed := charge(t, b, c, "wh-failed")
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
