package effects_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

// readyProvider reads the provider's URL from GET /ready, as any local
// process can, and returns it with the whole answer.
func readyProvider(t *testing.T, a *app.App) (string, string) {
	t.Helper()
	r := labtest.Do(t, http.MethodGet, a.URL()+"/ready", nil, "")
	ready := labtest.Decode[struct {
		Dependencies map[string]struct{ Describe string } `json:"dependencies"`
	}](t, r)
	m := regexp.MustCompile(`http://\S+`).FindString(ready.Dependencies["provider"].Describe)
	if m == "" {
		t.Fatalf("GET /ready names no provider URL: %s", r.Body)
	}
	return m, string(r.Body)
}

// chargeRun charges acme's acct-1 cents on the memory store under key, as
// part of run.
func chargeRun(t *testing.T, a *app.App, run, key string, cents int64) lab.Charge {
	t.Helper()
	e2e.OpenRun(t, a, run) // opening it again in the same namespace is a no-op
	h := http.Header{"Authorization": {"Bearer " + labtest.Acme}, "Content-Type": {"application/json"},
		"Idempotency-Key": {key}, "Lab-Run": {run}}
	r := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=memory", h, fmt.Sprintf(`{"account":"acct-1","amount_cents":%d}`, cents))
	if r.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", r.Status, r.Body)
	}
	return labtest.Decode[lab.Charge](t, r)
}

// TestProviderAPIClosed replays finding 2's first attack: a local process
// reads the lab's own provider from GET /ready and calls its API — posts a
// 1-cent capture for a 1,000,000-cent charge, reads every namespace's
// captures, sets another namespace's faults, deletes the records. Without
// the lab's API key each call is a 401 that changes nothing, /ready never
// shows the key, and the charge is captured once, by the relay, for its
// amount, and paid.
func TestProviderAPIClosed(t *testing.T) {
	t.Parallel()
	const key = "provider-key-of-this-lab"
	a := labtest.Start(t, e2e.Config(func(c *app.Config) { c.ProviderAPIKey = key }))
	ctx := t.Context()
	base, ready := readyProvider(t, a)
	if strings.Contains(ready, key) {
		t.Fatalf("GET /ready shows the provider's API key: %s", ready)
	}
	charge := chargeRun(t, a, "run-open-provider", "k-open-provider", 1_000_000)
	capture := `{"charge_id":"` + charge.ID + `","tenant":"acme","amount_cents":1,"currency":"USD","via":"outbox"}`
	for _, c := range []struct {
		method, path, body string
		header             http.Header
	}{
		{http.MethodPost, "/provider/captures", capture, http.Header{"Content-Type": {"application/json"}, provider.KeyHeader: {"attacker"}}},
		{http.MethodPost, "/provider/captures", capture, http.Header{"Content-Type": {"application/json"}, provider.KeyHeader: {"attacker-2"},
			provider.FaultHeader: {"decline"}, "Authorization": {"Bearer " + labtest.Acme}}},
		{http.MethodGet, "/provider/captures", "", nil},
		{http.MethodGet, "/provider/stats?namespace=globex", "", nil},
		{http.MethodPut, "/provider/faults/globex", `{"down":true}`, http.Header{"Content-Type": {"application/json"}}},
		{http.MethodDelete, "/provider/records", "", nil},
		{http.MethodDelete, "/provider/namespaces/acme", "", http.Header{"Authorization": {"Bearer wrong"}}},
	} {
		got := labtest.Do(t, c.method, base+c.path, c.header, c.body)
		if got.Status != http.StatusUnauthorized || labtest.Decode[lab.Problem](t, got).Code != "unauthenticated" {
			t.Errorf("%s %s without the API key: %d %s, want 401 unauthenticated", c.method, c.path, got.Status, got.Body)
		}
	}
	if f, err := a.Provider().Faults(ctx, "globex"); err != nil || f != (provider.Faults{}) {
		t.Fatalf("globex's faults %+v (%v): set without the key", f, err)
	}
	rec := settle(t, a, "run-open-provider")
	if rec.Agree != 1 || rec.Disagree != 0 {
		t.Fatalf("reconciliation %+v: want the charge captured once and paid", rec)
	}
	caps, err := a.Provider().Captures(ctx, provider.Filter{ChargeID: charge.ID})
	if err != nil || len(caps) != 1 || caps[0].AmountCents != 1_000_000 || caps[0].Key != lab.DerivedCaptureKey(charge.ID) {
		t.Fatalf("captures of %s: %+v (%v); want one, the relay's, for 1,000,000 cents", charge.ID, caps, err)
	}
}

// TestWebhooksSurviveALabStop replays finding 5: the lab's own provider
// captures a charge and owes its webhooks when the lab stops (here they
// are held back by webhook_delay_ms, so the stop lands between the
// capture and the webhook). The webhooks stay in the provider's records in
// PostgreSQL; a new lab on the same schema, a minute later, delivers them
// and the charge settles.
func TestWebhooksSurviveALabStop(t *testing.T) {
	t.Parallel()
	url, schema := labtest.Postgres(t)
	ticked := testsignal.New() // after each turn of the first lab's relay
	ctx := t.Context()
	first, err := app.Start(ctx, e2e.Config(func(c *app.Config) {
		c.DatabaseURL, c.PGSchema = url, schema
		c.Relay.Signals.Ticked = ticked
	}))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = first.Close(context.Background())
		}
	})
	if err := first.Provider().SetFaults(ctx, "acme", provider.Faults{WebhookDelayMS: 10_000}); err != nil {
		t.Fatal(err)
	}
	charge := chargeRun(t, first, "run-lab-stop", "k-lab-stop", 2500)
	// The relay delivered: the capture is at the provider, its webhooks owed.
	ticked.WaitUntil(t, "the relay delivering the capture", func() bool {
		s, err := first.Books().OutboxStats(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		return s.Delivered == 1
	})
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	closed = true
	pool := e2e.Pool(t, url)
	var state string
	var queued int
	if err := pool.QueryRow(ctx, `SELECT payment_state, (SELECT count(*) FROM `+schema+`.provider_webhooks WHERE state = 'pending')
		FROM `+schema+`.charges WHERE id = $1`, charge.ID).Scan(&state, &queued); err != nil || state != lab.PaymentPending || queued != 2 {
		t.Fatalf("after the stop: charge %s, %d webhooks pending (%v); want pending and 2", state, queued, err)
	}
	// A new lab on the same schema, a minute on: the delay is over.
	next := labtest.Start(t, e2e.Config(func(c *app.Config) {
		c.DatabaseURL, c.PGSchema = url, schema
		c.Clock = func() time.Time { return time.Now().Add(time.Minute) }
	}))
	// The provider records a webhook delivered once the lab has answered
	// it, so the charge may be paid a moment before the last is recorded.
	labtest.Eventually(t, "the charge settled after the restart and its webhooks recorded delivered", func() bool {
		ps, err := next.Books().Payments(ctx, "acme", "run-lab-stop", 10)
		if err != nil {
			t.Fatal(err)
		}
		got, err := next.Provider().Stats(ctx, provider.Filter{Run: "run-lab-stop"})
		if err != nil {
			t.Fatal(err)
		}
		return len(ps) == 1 && ps[0].State == lab.PaymentSucceeded && got.WebhooksDelivered == 2 && got.WebhooksQueued == 0
	})
	got, err := next.Provider().Stats(ctx, provider.Filter{Run: "run-lab-stop"})
	if err != nil || got.WebhooksDelivered != 2 || got.WebhooksQueued != 0 || got.CapturesApplied != 1 {
		t.Fatalf("provider %+v (%v): want one capture and its 2 webhooks delivered", got, err)
	}
}

// TestWebhookMustMatchItsCharge replays finding 2's webhook attacks over
// HTTP, on a lab whose relay is held so the charges wait uncaptured:
//   - a correctly signed "succeeded" for 1 cent of a 1,000,000-cent charge
//     is recorded as a mismatch, counted, shown by reconcile, and leaves the
//     charge pending;
//   - a declined capture the relay never made, sent ahead of the relay,
//     has the lab's own provider call back "failed": the charge is not
//     failed, and once the relay captures, its "succeeded" pays it.
func TestWebhookMustMatchItsCharge(t *testing.T) {
	t.Parallel()
	const secret = "whsec-test-match"
	a := labtest.Start(t, e2e.EffectsConfig(t, func(c *app.Config) { c.WebhookSecret = secret }))
	ctx := t.Context()
	a.HoldDelivery(true)
	payment := func(id string) lab.Payment {
		t.Helper()
		ps, err := a.Books().Payments(ctx, "acme", "", 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.ChargeID == id {
				return p
			}
		}
		t.Fatalf("charge %s not in the ledger", id)
		return lab.Payment{}
	}

	// One cent, signed with the lab's own secret.
	big := chargeRun(t, a, "run-one-cent", "k-one-cent", 1_000_000)
	r := postEvent(t, a, []byte(secret), provider.WebhookEvent{ID: "evt_one_cent", Type: lab.WebhookCaptureSucceeded,
		Data: provider.WebhookData{CaptureID: "cap_one_cent", ChargeID: big.ID, Tenant: "acme", AmountCents: 1, Currency: "USD", Status: "succeeded"}},
		time.Now())
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"outcome":"mismatch"`) {
		t.Fatalf("a 1-cent webhook for a 1,000,000-cent charge: %d %s, want 200 mismatch", r.Status, r.Body)
	}
	if p := payment(big.ID); p.State != lab.PaymentPending || p.Mismatched != 1 {
		t.Fatalf("after the 1-cent webhook: %+v, want pending with one mismatch", p)
	}
	if m := scrape(t, a.URL()); m[`lab_webhooks_total{outcome="mismatch"}`] != 1 || m[`lab_webhooks_total{outcome="applied"}`] != 0 {
		t.Fatalf("metrics: mismatch %v, applied %v; want 1 and 0", m[`lab_webhooks_total{outcome="mismatch"}`], m[`lab_webhooks_total{outcome="applied"}`])
	}
	rec := labtest.Decode[reconciliation](t, labtest.Do(t, http.MethodGet, a.URL()+"/lab/reconcile?run=run-one-cent", nil, ""))
	if len(rec.Findings) != 1 || rec.Findings[0].Problem != "webhook_mismatch" || rec.Disagree != 1 {
		t.Fatalf("reconciliation %+v: want the charge's webhook_mismatch", rec)
	}

	// A declined capture ahead of the relay, under another key.
	ahead := chargeRun(t, a, "run-ahead", "k-ahead", 1_000_000)
	stray, err := a.Provider().Capture(ctx, "not-the-relay", provider.CaptureRequest{ChargeID: ahead.ID, Namespace: "acme", Tenant: "acme", Run: "run-ahead",
		AmountCents: 1_000_000, Currency: "USD", Via: provider.ViaOutbox}, "decline")
	if err != nil || stray.Status != provider.StatusFailed {
		t.Fatalf("the stray capture: %+v, %v", stray, err)
	}
	labtest.Eventually(t, "the stray capture's failed webhook refused", func() bool {
		return scrape(t, a.URL())[`lab_webhooks_total{outcome="unknown_capture"}`] >= 1
	})
	if p := payment(ahead.ID); p.State != lab.PaymentPending {
		t.Fatalf("a capture the relay never made moved the charge: %+v", p)
	}
	a.HoldDelivery(false)
	labtest.Eventually(t, "the relay's capture pays the charge", func() bool { return payment(ahead.ID).State == lab.PaymentSucceeded })
	// The stray "failed", retried by the provider, is now a mismatch.
	labtest.Eventually(t, "the stray webhook recorded as a mismatch", func() bool { return payment(ahead.ID).Mismatched == 1 })
	p := payment(ahead.ID)
	if p.State != lab.PaymentSucceeded || p.CaptureID == stray.ID || p.CaptureID == "" || !strings.Contains(p.Mismatch, stray.ID) {
		t.Fatalf("after the relay's capture: %+v; want paid by its own capture, the stray one a mismatch", p)
	}
}

// TestStuckChargeReported: a charge captured and still pending past the
// stuck bound (its webhooks held back at the provider) is reported stuck
// by reconcile, a disagreement rather than "still settling", and /metrics
// shows the oldest stuck charge's age.
func TestStuckChargeReported(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.EffectsConfig(t, func(c *app.Config) { c.StuckAfter = 200 * time.Millisecond }))
	ctx := t.Context()
	if err := a.Provider().SetFaults(ctx, "acme", provider.Faults{WebhookDelayMS: 60_000}); err != nil {
		t.Fatal(err)
	}
	charge := chargeRun(t, a, "run-stuck", "k-stuck", 2500)
	var rec reconciliation
	labtest.Eventually(t, "the charge reported stuck", func() bool {
		rec = labtest.Get[reconciliation](t, a.URL()+"/lab/reconcile?run=run-stuck", "")
		return len(rec.Findings) == 1 && rec.Findings[0].Problem == "stuck"
	})
	if rec.Findings[0].ChargeID != charge.ID || rec.Disagree != 1 || rec.Pending != 0 {
		t.Fatalf("reconciliation %+v: want the charge stuck, a disagreement", rec)
	}
	// The gauge counts from when the relay recorded the capture, a little
	// after the provider made it.
	labtest.Eventually(t, "lab_oldest_stuck_charge_seconds past the 200ms bound", func() bool {
		return scrape(t, a.URL())["lab_oldest_stuck_charge_seconds"] > 0.2
	})
}
