package app_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants/memory"
)

// TestPruneAfterOutlastsTheWebhookWindow: a retention the provider's
// redelivery could outlast is refused, naming the flag.
func TestPruneAfterOutlastsTheWebhookWindow(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = []variant.Variant{memory.Variant()}
	cfg.WebhookWindow, cfg.PruneAfter = 10*time.Minute, 10*time.Minute
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "-prune-after") || !strings.Contains(err.Error(), "at least 11m0s") {
		t.Fatalf("a retention as long as the webhook window: %v, want it refused, naming -prune-after and the least it may be", err)
	}
	cfg.PruneAfter = 11 * time.Minute
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the window and the lease: %v", err)
	}
	cfg.PruneInterval = 0
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "prune interval") {
		t.Fatalf("no prune interval: %v", err)
	}
}

// TestPrunerKeepsTheCounts: a lab whose delivered events and webhooks
// outlived the retention prunes them as it runs, and its outbox counts
// read the same; the charge stays. Closing it stops the pruner.
func TestPrunerKeepsTheCounts(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	clock := labtest.NewClock(time.Now())
	cfg := app.DefaultConfig()
	cfg.Variants = []variant.Variant{memory.Variant()}
	cfg.Addr, cfg.EmbedPostgres, cfg.EmbedRedis, cfg.RedisPair = "127.0.0.1:0", false, false, false
	cfg.Clock, cfg.PruneInterval = clock.Now, 10*time.Millisecond
	a, err := app.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	closeLab := func() {
		if closed {
			return
		}
		closed = true
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil {
			t.Errorf("closing the lab: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	}
	defer closeLab()
	if r := labtest.Charge(t, a.URL(), memory.Name, labtest.Acme, "k-prune", `{"account":"acct-1","amount_cents":100,"currency":"USD"}`); r.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", r.Status, r.Body)
	}
	ctx := t.Context()
	books := a.Books()
	labtest.Eventually(t, "the event delivered and the charge settled", func() bool {
		// The clock moves while the test waits, as time would: a webhook
		// that beat the relay's record of its capture (answered 409) is
		// due again after its backoff, which a still clock never reaches.
		clock.Advance(100 * time.Millisecond)
		st, err := books.OutboxStats(ctx, "acme")
		ps, perr := books.Payments(ctx, "acme", "", 10)
		return err == nil && perr == nil && st.Delivered == 1 && len(ps) == 1 && ps[0].State == lab.PaymentSucceeded
	})
	before, err := books.OutboxStats(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(cfg.PruneAfter + time.Minute)
	labtest.Eventually(t, "the delivered event pruned", func() bool {
		evs, err := books.Events(ctx, "acme", 10)
		return err == nil && len(evs) == 0
	})
	after, err := books.OutboxStats(ctx, "acme")
	if err != nil || after != before {
		t.Fatalf("outbox after pruning %+v (%v), want %+v as before", after, err, before)
	}
	if ps, err := books.Payments(ctx, "acme", "", 10); err != nil || len(ps) != 1 || ps[0].State != lab.PaymentSucceeded {
		t.Fatalf("the ledger after pruning: %+v (%v), want the charge, succeeded", ps, err)
	}
	closeLab()
}
