package pgdb_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/provider"
)

// prunable is the provider's records that the pruner prunes.
type prunable interface {
	provider.Records
	provider.Pruner
}

// hooks are n webhooks of c, due at at, retried for window.
func hooks(c provider.Capture, n int, at time.Time, window time.Duration) []provider.Webhook {
	var out []provider.Webhook
	for i := range n {
		out = append(out, provider.Webhook{CaptureID: c.ID, Seq: i, EventID: fmt.Sprintf("evt_%s_%d", c.Key, i), Type: provider.EventCaptureProcessing,
			ChargeID: c.ChargeID, Namespace: c.Namespace, Tenant: c.Tenant, Run: c.Run, Body: []byte(`{}`), State: provider.WebhookPending,
			NextAttempt: at, GiveUpAt: at.Add(window), CreatedAt: at})
	}
	return out
}

// TestProviderPruning: both kinds of records prune only receipts and
// delivered webhooks past the retention, in batches; their Stats read the
// same before and after (a filter by charge sums the rows alone), the
// captures all stay, a webhook still pending within its window is sent
// again, and a reset forgets the namespace's roll-up.
func TestProviderPruning(t *testing.T) {
	t.Parallel()
	for _, kind := range []struct {
		name string
		open func(t *testing.T) prunable
	}{
		{"memory", func(*testing.T) prunable { return provider.NewMemory() }},
		{"postgres", func(t *testing.T) prunable {
			pools, _ := providerPools(t, 1)
			return pgdb.NewProviderRecords(pools[0])
		}},
	} {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			testProviderPruning(t, kind.open(t))
		})
	}
}

func testProviderPruning(t *testing.T, r prunable) {
	ctx := t.Context()
	t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	const window = 10 * time.Minute
	capture := func(tenant, key, run string) provider.Capture {
		c := providerCapture(tenant, key, t0)
		c.Run = run
		return c
	}
	c1, c2, c3 := capture("acme", "k1", "run-1"), capture("acme", "k2", "run-1"), capture("globex", "k3", "")
	for _, c := range []provider.Capture{c1, c2, c3} {
		n := 2
		if c == c3 {
			n = 1
		}
		if _, err := r.Capture(ctx, c, hooks(c, n, t0, window), nil); err != nil {
			t.Fatal(err)
		}
	}
	// Delivered at t0: c1's two and c3's. c2's first dies, its second
	// waits a minute for its next attempt.
	for round := range 2 {
		claimed, err := r.ClaimWebhooks(ctx, t0, 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range claimed {
			switch {
			case w.CaptureID == c2.ID && w.Seq == 0:
				err = r.WebhookFailed(ctx, w, t0, true, 400, "refused")
			case w.CaptureID == c2.ID:
				err = r.WebhookFailed(ctx, w, t0.Add(time.Minute), false, 503, "unavailable")
			default:
				err = r.WebhookDelivered(ctx, w, t0, 200)
			}
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
	}
	for _, rc := range []provider.Receipt{
		{EventID: "evt-a", ChargeID: c1.ChargeID, Namespace: "acme", Tenant: "acme", Run: "run-1", Via: provider.ViaOutbox, ReceivedAt: t0},
		{EventID: "evt-a", ChargeID: c1.ChargeID, Namespace: "acme", Tenant: "acme", Run: "run-1", Via: provider.ViaOutbox, ReceivedAt: t0},
		{EventID: "evt-b", ChargeID: c3.ChargeID, Namespace: "globex", Tenant: "globex", Via: provider.ViaOutbox, ReceivedAt: t0},
		{EventID: "evt-c", ChargeID: c2.ChargeID, Namespace: "acme", Tenant: "acme", Run: "run-1", Via: provider.ViaOutbox, ReceivedAt: t0.Add(time.Hour)},
	} {
		if _, err := r.Receipt(ctx, rc); err != nil {
			t.Fatal(err)
		}
	}
	filters := []provider.Filter{{}, {Namespace: "acme"}, {Namespace: "acme", Run: "run-1"}, {Namespace: "globex"}}
	stats := func() []provider.Stats {
		t.Helper()
		var out []provider.Stats
		for _, f := range filters {
			s, err := r.Stats(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	before := stats()
	if want := (provider.Stats{CapturesApplied: 3, CaptureRequests: 3, CapturedCents: 300, Receipts: 3, ReceiptDeliveries: 4,
		WebhooksQueued: 1, WebhooksDelivered: 3, WebhooksDead: 1}); before[0] != want {
		t.Fatalf("stats before pruning %+v, want %+v", before[0], want)
	}

	// What is older than t0 + 1µs goes: both kinds keep microseconds.
	cutoff := t0.Add(time.Microsecond)
	if calls := labtest.PruneInBatches(t, r.PruneWebhooks, cutoff, 2); !slices.Equal(calls, []int{2, 1}) {
		t.Fatalf("pruning webhooks two at a time deleted %v, want [2 1]: the three delivered", calls)
	}
	if calls := labtest.PruneInBatches(t, r.PruneReceipts, cutoff, 1); !slices.Equal(calls, []int{1, 1, 0}) {
		t.Fatalf("pruning receipts one at a time deleted %v, want [1 1 0]: evt-a and evt-b, not the younger evt-c", calls)
	}
	if after := stats(); !slices.Equal(after, before) {
		t.Fatalf("pruning moved the stats:\n%+v\n%+v", before, after)
	}
	if s, err := r.Stats(ctx, provider.Filter{ChargeID: c1.ChargeID}); err != nil || s.WebhooksDelivered != 0 || s.Receipts != 0 || s.CapturesApplied != 1 {
		t.Fatalf("one charge's stats after pruning %+v (%v), want its capture and none of its pruned rows", s, err)
	}
	if list, err := r.Captures(ctx, provider.Filter{}); err != nil || len(list) != 3 {
		t.Fatalf("captures after pruning: %d (%v), want all 3", len(list), err)
	}
	if calls := labtest.PruneInBatches(t, r.PruneWebhooks, t0.Add(24*time.Hour), 10); !slices.Equal(calls, []int{0}) {
		t.Fatalf("a later pass deleted %v webhooks, want none: the dead one and the pending one stay", calls)
	}

	// Within its window the pending webhook is still sent again.
	claimed, err := r.ClaimWebhooks(ctx, t0.Add(time.Minute), 10, time.Minute)
	if err != nil || len(claimed) != 1 || claimed[0].CaptureID != c2.ID || claimed[0].Seq != 1 {
		t.Fatalf("claim after pruning: %+v (%v), want c2's second webhook", claimed, err)
	}
	if err := r.WebhookDelivered(ctx, claimed[0], t0.Add(time.Minute), 200); err != nil {
		t.Fatal(err)
	}

	if err := r.Reset(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if s, err := r.Stats(ctx, provider.Filter{Namespace: "acme"}); err != nil || s != (provider.Stats{}) {
		t.Fatalf("acme's stats after its reset %+v (%v), want nothing", s, err)
	}
	if s, err := r.Stats(ctx, provider.Filter{Namespace: "globex"}); err != nil || s != before[3] {
		t.Fatalf("globex's stats after acme's reset %+v (%v), want %+v", s, err, before[3])
	}
	if err := r.Reset(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if s, err := r.Stats(ctx, provider.Filter{}); err != nil || s != (provider.Stats{}) {
		t.Fatalf("stats after a reset of everything %+v (%v)", s, err)
	}
}
