package effects_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/signature"
	"github.com/idempotency-lab/lab/lab/testsignal"
	"github.com/idempotency-lab/lab/variants/postgres"
)

// chargeMany sends n charges with distinct keys, 4 at a time, as one run:
// under the namespace's share of the pool (5 of 20), so no charge queues
// for a connection and a loaded machine cannot turn one into a 503.
func chargeMany(t *testing.T, base string, store lab.StoreName, run string, n int, extra http.Header) {
	t.Helper()
	keys := make(chan int)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range keys {
				h := http.Header{"Authorization": {"Bearer " + labtest.Acme}, "Content-Type": {"application/json"},
					"Idempotency-Key": {fmt.Sprintf("%s-%d", run, i)}, "Lab-Run": {run}}
				for k, v := range extra {
					h[k] = v
				}
				r := labtest.Do(t, http.MethodPost, base+"/charges?store="+string(store), h, e2e.Body2500)
				// Shed on a busy machine (no connection or lock in time):
				// sent again with its key after a pause, as a client does.
				for r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != "" {
					time.Sleep(100 * time.Millisecond)
					r = labtest.Do(t, http.MethodPost, base+"/charges?store="+string(store), h, e2e.Body2500)
				}
				if r.Status != http.StatusCreated {
					t.Errorf("charge %d: %d %s", i, r.Status, r.Body)
				}
			}
		})
	}
	for i := range n {
		keys <- i
	}
	close(keys)
	wg.Wait()
}

// settle waits until the outbox has nothing pending and reconciliation
// has nothing pending (every webhook in), and returns the reconciliation.
func settle(t *testing.T, a *app.App, run string) reconciliation {
	t.Helper()
	var rec reconciliation
	labtest.Eventually(t, "the outbox and the reconciliation of "+run+" settled", func() bool {
		s, err := a.Books().OutboxStats(t.Context(), "acme")
		if err != nil {
			t.Fatal(err)
		}
		if s.Pending != 0 {
			return false
		}
		// Reconciling asks the provider, which may not answer in time on a
		// loaded machine: a 503 with Retry-After is a "not yet".
		r := labtest.Do(t, http.MethodGet, a.URL()+"/lab/reconcile?run="+run, nil, "")
		if r.Status == http.StatusServiceUnavailable && r.Header.Get("Retry-After") != "" {
			return false
		}
		if r.Status != http.StatusOK {
			t.Fatalf("reconciling %s: %d %s", run, r.Status, r.Body)
		}
		rec = labtest.Decode[reconciliation](t, r)
		return rec.Pending == 0
	})
	return rec
}

// reconciliation is the part of GET /lab/reconcile these tests read.
type reconciliation struct {
	ChargesChecked int `json:"charges_checked"`
	Agree          int `json:"agree"`
	Disagree       int `json:"disagree"`
	Pending        int `json:"pending"`
	Findings       []struct {
		ChargeID string `json:"charge_id"`
		Problem  string `json:"problem"`
		Ledger   *struct {
			State string `json:"payment_state"`
		} `json:"ledger"`
	} `json:"findings"`
}

// TestEffectsExactlyOnceAtAFlakyProvider: 200 charges whose provider fails
// 30% of calls and loses the answer of 15% of those it applies. The relay
// retries (visibly more than 200 deliveries) and every charge is captured
// exactly once, its receipt kept once, and paid through a verified webhook.
func TestEffectsExactlyOnceAtAFlakyProvider(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.EffectsConfig(t))
	ctx := t.Context()
	if err := a.Provider().SetFaults(ctx, "acme", provider.Faults{ErrorRate: 0.3, AppliedResponseLost: 0.15}); err != nil {
		t.Fatal(err)
	}
	const charges = 200
	e2e.OpenRun(t, a, "run-flaky")
	chargeMany(t, a.URL(), postgres.Name, "run-flaky", charges, nil)
	rec := settle(t, a, "run-flaky")

	got, err := a.Provider().Stats(ctx, provider.Filter{Run: "run-flaky"})
	if err != nil {
		t.Fatal(err)
	}
	events, err := a.Books().Events(ctx, "acme", charges)
	if err != nil {
		t.Fatal(err)
	}
	attempts := 0
	for _, ev := range events {
		attempts += ev.Attempts
	}
	if st, err := a.Books().OutboxStats(ctx, "acme"); err != nil || st.Retries != attempts-len(events) || st.InFlight != 0 {
		t.Errorf("outbox stats %+v (%v): want %d retries (%d attempts for %d events), none in flight", st, err, attempts-len(events), attempts, len(events))
	}
	t.Logf("provider: %d capture calls for %d captures, %d receipt deliveries for %d receipts; %d errors injected, %d answers lost; relay: %d delivery attempts for %d events",
		got.CaptureRequests, got.CapturesApplied, got.ReceiptDeliveries, got.Receipts, got.ErrorsInjected, got.ResponsesLost, attempts, len(events))
	s := e2e.RunStats(t, a, "run-flaky")
	if s.Charges != charges || s.OutboxEvents != charges || s.Delivered != charges {
		t.Fatalf("ledger %+v: want %d charges, events and deliveries", s, charges)
	}
	if got.CapturesApplied != charges || got.ChargesCapturedTwice != 0 || got.Receipts != charges || got.DirectCaptures != 0 {
		t.Fatalf("provider %+v: want each of %d charges captured once and receipted once", got.Stats, charges)
	}
	if attempts <= charges || got.ErrorsInjected == 0 || got.ResponsesLost == 0 || got.CaptureRequests <= charges {
		t.Fatalf("%d relay attempts, provider %+v: the faults never bit", attempts, got)
	}
	if rec.ChargesChecked != charges || rec.Agree != charges || rec.Disagree != 0 {
		t.Fatalf("reconciliation %+v: want all %d charges agreeing (captured once, paid by webhook)", rec, charges)
	}
	// The signals: the relay's outcomes and the charge path's latency.
	m := scrape(t, a.URL())
	if m[`lab_relay_deliveries_total{outcome="delivered"}`] != charges || m[`lab_relay_deliveries_total{outcome="failed"}`] == 0 ||
		m[`lab_relay_deliveries_total{outcome="dead"}`] != 0 {
		t.Errorf("relay deliveries delivered %v, failed %v, dead %v; want %d, some, none", m[`lab_relay_deliveries_total{outcome="delivered"}`],
			m[`lab_relay_deliveries_total{outcome="failed"}`], m[`lab_relay_deliveries_total{outcome="dead"}`], charges)
	}
	if n := m[`lab_charge_duration_seconds_count{outcome="charged",store="postgres"}`]; n != charges {
		t.Errorf("charge latency observations %v, want %d", n, charges)
	}
}

// TestRandomCaptureKeyCapturesTwice is the same flaky provider with the
// mistake made: each delivery attempt keys its capture at random, so an
// attempt whose answer was lost is captured again, and reconciliation
// lists the charges captured twice.
func TestRandomCaptureKeyCapturesTwice(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.EffectsConfig(t))
	ctx := t.Context()
	if err := a.Provider().SetFaults(ctx, "acme", provider.Faults{AppliedResponseLost: 0.5}); err != nil {
		t.Fatal(err)
	}
	const charges = 20
	e2e.OpenRun(t, a, "run-random-key")
	chargeMany(t, a.URL(), postgres.Name, "run-random-key", charges, http.Header{lab.FaultHeader: {"capture_key=random"}})
	rec := settle(t, a, "run-random-key")
	got, err := a.Provider().Stats(ctx, provider.Filter{Run: "run-random-key"})
	if err != nil {
		t.Fatal(err)
	}
	twice := 0
	for _, f := range rec.Findings {
		if f.Problem == "captured_twice" {
			twice++
		}
	}
	t.Logf("provider %+v; reconciliation: %d captured twice", got.Stats, twice)
	if s := e2e.RunStats(t, a, "run-random-key"); s.Charges != charges {
		t.Fatalf("ledger %+v: want %d charges", s, charges)
	}
	if got.ChargesCapturedTwice == 0 || got.CapturesApplied <= charges || twice != got.ChargesCapturedTwice || rec.Disagree < twice {
		t.Fatalf("provider %+v, reconciliation %+v: a lost answer must cost a second capture with random keys", got.Stats, rec)
	}
	// The receipts, keyed by event id, stay one per charge all the same.
	if got.Receipts != charges {
		t.Fatalf("%d receipts, want %d", got.Receipts, charges)
	}
}

// TestWebhooksDuplicatedReorderedForged: the provider sends every final
// webhook twice, before its processing event, and a forged copy besides.
// Each charge ends paid, each event is applied once, the forgeries are
// refused with 401 and counted.
func TestWebhooksDuplicatedReorderedForged(t *testing.T) {
	t.Parallel()
	cfg := e2e.EffectsConfig(t)
	a := labtest.Start(t, cfg)
	ctx := t.Context()
	if err := a.Provider().SetFaults(ctx, "acme", provider.Faults{WebhookDuplicate: true, WebhookReorder: true, WebhookBadSignature: true}); err != nil {
		t.Fatal(err)
	}
	const charges = 5
	e2e.OpenRun(t, a, "run-webhooks")
	chargeMany(t, a.URL(), postgres.Name, "run-webhooks", charges, nil)
	rec := settle(t, a, "run-webhooks")
	if rec.Agree != charges || rec.Disagree != 0 {
		t.Fatalf("reconciliation %+v: want %d charges paid", rec, charges)
	}
	// Each charge: its final event applied, its duplicate refused as such,
	// the late processing event ignored, the forged copy refused. Webhooks
	// are counted per lab process, and this lab is alone. The late
	// processing events may still be on their way once every charge is
	// paid: wait for the counts to settle, then insist on them.
	want := map[string]float64{
		`lab_webhooks_total{outcome="applied"}`:       charges,
		`lab_webhooks_total{outcome="duplicate"}`:     charges,
		`lab_webhooks_total{outcome="ignored"}`:       charges,
		`lab_webhooks_total{outcome="bad_signature"}`: charges,
	}
	var m map[string]float64
	labtest.Eventually(t, "every webhook counted", func() bool {
		m = scrape(t, a.URL())
		all := true
		for series, n := range want {
			all = all && m[series] >= n
		}
		return all
	})
	for series, n := range want {
		if m[series] != n {
			t.Errorf("%s = %v, want %v", series, m[series], n)
		}
	}
	var rows, distinct int
	err := e2e.Pool(t, cfg.DatabaseURL).QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+cfg.PGSchema+`.webhook_events`).Scan(&rows, &distinct)
	if err != nil || rows != 2*charges || distinct != rows {
		t.Fatalf("webhook_events: %d rows, %d distinct (%v); want %d, one per event id", rows, distinct, err, 2*charges)
	}
	got, err := a.Provider().Stats(ctx, provider.Filter{})
	if err != nil || got.WebhooksRejected < charges {
		t.Fatalf("provider counters %+v (%v): the %d forgeries should be refused", got.Counters, err, charges)
	}
}

// TestDeclinedCaptureFailsTheCharge: a declined capture's webhook moves the
// charge to failed, and a forged "succeeded" cannot undo it.
func TestDeclinedCaptureFailsTheCharge(t *testing.T) {
	t.Parallel()
	const secret = "whsec-test-declined"
	a := labtest.Start(t, e2e.EffectsConfig(t, func(c *app.Config) { c.WebhookSecret = secret }))
	ctx := t.Context()
	if err := a.Provider().SetFaults(ctx, "acme", provider.Faults{Decline: true}); err != nil {
		t.Fatal(err)
	}
	e2e.OpenRun(t, a, "run-declined")
	chargeMany(t, a.URL(), postgres.Name, "run-declined", 1, nil)
	rec := settle(t, a, "run-declined")
	if rec.Agree != 1 || rec.ChargesChecked != 1 {
		t.Fatalf("reconciliation %+v", rec)
	}
	ps, err := a.Books().Payments(ctx, "acme", "run-declined", 10)
	if err != nil || len(ps) != 1 || ps[0].State != lab.PaymentFailed {
		t.Fatalf("payments %+v (%v): want one failed", ps, err)
	}
	// Correctly signed, about the charge's own capture, a late
	// "succeeded" still changes nothing.
	caps, err := a.Provider().Captures(ctx, provider.Filter{ChargeID: ps[0].ChargeID})
	if err != nil || len(caps) != 1 {
		t.Fatalf("captures %+v (%v)", caps, err)
	}
	r := postEvent(t, a, []byte(secret), provider.WebhookEvent{ID: "evt_late_success", Type: lab.WebhookCaptureSucceeded,
		Data: provider.WebhookData{ChargeID: ps[0].ChargeID, Tenant: "acme", CaptureID: caps[0].ID, AmountCents: caps[0].AmountCents, Currency: caps[0].Currency}},
		time.Now())
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"outcome":"ignored"`) {
		t.Fatalf("late success: %d %s", r.Status, r.Body)
	}
	if ps, _ := a.Books().Payments(ctx, "acme", "run-declined", 10); ps[0].State != lab.PaymentFailed {
		t.Fatalf("a failed charge became %s", ps[0].State)
	}
}

// postWebhook posts one webhook about no capture in particular, signed
// with secret at signedAt.
func postWebhook(t *testing.T, a *app.App, secret []byte, id, typ, chargeID, tenant string, signedAt time.Time) labtest.Reply {
	t.Helper()
	return postEvent(t, a, secret, provider.WebhookEvent{ID: id, Type: typ, Data: provider.WebhookData{ChargeID: chargeID, Tenant: tenant}}, signedAt)
}

// postEvent posts ev, signed with secret (nil: unsigned) at signedAt.
func postEvent(t *testing.T, a *app.App, secret []byte, ev provider.WebhookEvent, signedAt time.Time) labtest.Reply {
	t.Helper()
	ev.Created = signedAt.Unix()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	body := string(b)
	h := http.Header{"Content-Type": {"application/json"}}
	if secret != nil {
		h.Set(signature.Header, signature.Sign(secret, signedAt, []byte(body)))
	}
	return labtest.Do(t, http.MethodPost, a.URL()+"/webhooks/provider", h, body)
}

// TestWebhookRoute: the webhook route refuses what is unsigned, forged,
// stale or malformed with a problem and changes nothing; a verified event
// applies once.
func TestWebhookRoute(t *testing.T) {
	t.Parallel()
	secret := []byte("whsec-test-route")
	for _, ledger := range []string{"memory", "postgres"} {
		t.Run(ledger, func(t *testing.T) {
			cfg := e2e.Config(func(c *app.Config) { c.WebhookSecret = string(secret) })
			if ledger == "postgres" {
				cfg = e2e.EffectsConfig(t, func(c *app.Config) { c.WebhookSecret = string(secret) })
			}
			a := labtest.Start(t, cfg)
			ctx := t.Context()
			// A charge whose delivery is held back (provider down), so no
			// webhook of the provider's own interferes.
			if err := a.Provider().SetFaults(ctx, "acme", provider.Faults{Down: true}); err != nil {
				t.Fatal(err)
			}
			r := labtest.Charge(t, a.URL(), "memory", labtest.Acme, "k-webhook-route", e2e.Body2500)
			if r.Status != http.StatusCreated {
				t.Fatalf("charge: %d %s", r.Status, r.Body)
			}
			chargeID := labtest.Decode[lab.Charge](t, r).ID
			now := time.Now()
			for _, c := range []struct {
				name   string
				reply  labtest.Reply
				status int
				code   string
			}{
				{"unsigned", postWebhook(t, a, nil, "evt_1", lab.WebhookCaptureFailed, chargeID, "acme", now), 401, "webhook_signature_invalid"},
				{"wrong secret", postWebhook(t, a, []byte("guess"), "evt_1", lab.WebhookCaptureFailed, chargeID, "acme", now), 401, "webhook_signature_invalid"},
				{"stale", postWebhook(t, a, secret, "evt_1", lab.WebhookCaptureFailed, chargeID, "acme", now.Add(-time.Hour)), 401, "webhook_signature_invalid"},
				{"unknown type", postWebhook(t, a, secret, "evt_1", "capture.refunded", chargeID, "acme", now), 400, "invalid_webhook"},
				{"unknown charge", postWebhook(t, a, secret, "evt_1", lab.WebhookCaptureFailed, "ch_nope", "acme", now), 404, "charge_not_found"},
				{"another tenant", postWebhook(t, a, secret, "evt_1", lab.WebhookCaptureFailed, chargeID, "globex", now), 404, "charge_not_found"},
				{"no event id", postWebhook(t, a, secret, "", lab.WebhookCaptureFailed, chargeID, "acme", now), 400, "invalid_webhook"},
			} {
				if c.reply.Status != c.status || c.reply.Header.Get("Content-Type") != "application/problem+json" ||
					labtest.Decode[lab.Problem](t, c.reply).Code != c.code {
					t.Errorf("%s: %d %s, want %d %s", c.name, c.reply.Status, c.reply.Body, c.status, c.code)
				}
			}
			// A tampered body with the original signature.
			body := fmt.Sprintf(`{"event_id":"evt_1","type":"capture.succeeded","data":{"charge_id":%q,"tenant":"acme"}}`, chargeID)
			h := http.Header{signature.Header: {signature.Sign(secret, now, []byte(body))}}
			tampered := strings.Replace(body, "succeeded", "failed", 1)
			if r := labtest.Do(t, http.MethodPost, a.URL()+"/webhooks/provider", h, tampered); r.Status != http.StatusUnauthorized {
				t.Errorf("tampered: %d %s", r.Status, r.Body)
			}
			if ps, _ := a.Books().Payments(ctx, "acme", "", 10); len(ps) != 1 || ps[0].State != lab.PaymentPending || ps[0].Webhooks != 0 || ps[0].Mismatched != 0 {
				t.Fatalf("after refused webhooks: %+v, want the charge pending with none recorded", ps)
			}
			// Not the charge's: another amount, or no capture of it recorded.
			mismatched := provider.WebhookData{ChargeID: chargeID, Tenant: "acme", CaptureID: "cap_route", AmountCents: 1, Currency: "USD"}
			r = postEvent(t, a, secret, provider.WebhookEvent{ID: "evt_cent", Type: lab.WebhookCaptureSucceeded, Data: mismatched}, now)
			if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"outcome":"mismatch"`) {
				t.Fatalf("a 1-cent webhook: %d %s, want 200 mismatch", r.Status, r.Body)
			}
			matching := provider.WebhookData{ChargeID: chargeID, Tenant: "acme", CaptureID: "cap_route", AmountCents: 2500, Currency: "USD"}
			r = postEvent(t, a, secret, provider.WebhookEvent{ID: "evt_ok", Type: lab.WebhookCaptureSucceeded, Data: matching}, now)
			if r.Status != http.StatusConflict || labtest.Decode[lab.Problem](t, r).Code != "capture_not_recorded" {
				t.Fatalf("before the capture is recorded: %d %s, want 409 capture_not_recorded", r.Status, r.Body)
			}
			if ps, _ := a.Books().Payments(ctx, "acme", "", 10); ps[0].State != lab.PaymentPending || ps[0].Webhooks != 0 || ps[0].Mismatched != 1 {
				t.Fatalf("after a mismatch and an unrecorded capture: %+v, want pending, one mismatch", ps)
			}
			// The lab's own capture, told by its webhook before the relay
			// recorded the answer: the key says whose it is.
			own := matching
			own.IdempotencyKey = lab.DerivedCaptureKey(chargeID)
			r = postEvent(t, a, secret, provider.WebhookEvent{ID: "evt_own", Type: lab.WebhookCaptureProcessing, Data: own}, now)
			if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"outcome":"ignored"`) {
				t.Fatalf("the processing event of the lab's own capture: %d %s, want 200 ignored", r.Status, r.Body)
			}
			if ps, _ := a.Books().Payments(ctx, "acme", "", 10); ps[0].State != lab.PaymentPending || ps[0].CaptureID != "cap_route" || ps[0].Webhooks != 1 {
				t.Fatalf("after the lab's own capture's processing event: %+v, want pending, captured as cap_route", ps)
			}
			// The relay's capture, as it records the provider's answer.
			if err := a.Books().RecordCapture(ctx, "acme", chargeID, "acme", "cap_route"); err != nil {
				t.Fatal(err)
			}
			for i, want := range []string{"applied", "duplicate"} {
				r := postEvent(t, a, secret, provider.WebhookEvent{ID: "evt_ok", Type: lab.WebhookCaptureSucceeded, Data: matching}, now)
				if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"outcome":"`+want+`"`) {
					t.Fatalf("verified webhook, try %d: %d %s, want %s", i+1, r.Status, r.Body, want)
				}
			}
			if ps, _ := a.Books().Payments(ctx, "acme", "", 10); ps[0].State != lab.PaymentSucceeded || ps[0].Webhooks != 2 {
				t.Fatalf("after a verified webhook twice: %+v", ps)
			}
		})
	}
}

// scrape reads a lab's /metrics into series → value.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	r := labtest.Do(t, http.MethodGet, base+"/metrics", nil, "")
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(r.Body)))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// TestEffectsMatrix runs the effects matrix: every cell's verdict is its
// design's usual one, its figures come from the ledger and the provider,
// and the README shows the same table.
func TestEffectsMatrix(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.EffectsConfig(t))
	r := labtest.Do(t, http.MethodGet, a.URL()+"/lab/effects", nil, "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET /lab/effects: %d %s", r.Status, r.Body)
	}
	m := labtest.Decode[experiment.EffectMatrix](t, r)
	if bad := m.Mismatches(); len(bad) > 0 {
		t.Fatalf("unusual verdicts:\n%s", strings.Join(bad, "\n"))
	}
	cells := map[string]experiment.EffectCell{}
	for _, row := range m.Rows {
		for _, c := range row.Cells {
			cells[row.Case.Name+"/"+c.Design] = c
			t.Logf("%s / %s: %s — %s (%s)", row.Case.Name, c.Design, c.Verdict, c.Explanation, c.Evidence)
		}
	}
	if len(cells) != len(experiment.EffectCases())*len(experiment.EffectDesigns()) {
		t.Fatalf("%d cells", len(cells))
	}
	// The figures behind the lesson, cell by cell.
	for name, want := range map[string]struct{ charges, captures, receipts int }{
		"provider_down/direct":                        {1, 0, 0},
		"provider_down/outbox_derived_key":            {1, 1, 1},
		"applied_response_lost/outbox_random_key":     {1, 2, 1},
		"applied_response_lost/outbox_derived_key":    {1, 1, 1},
		"sent_then_reverted/direct":                   {1, 2, 2},
		"sent_then_reverted/outbox_derived_key":       {1, 1, 1},
		"webhooks_duplicated_reordered_forged/direct": {1, 1, 1},
	} {
		c := cells[name]
		if c.Charges != want.charges || c.Captures != want.captures || c.Receipts != want.receipts {
			t.Errorf("%s: %d charges, %d captures, %d receipts; want %+v", name, c.Charges, c.Captures, c.Receipts, want)
		}
	}
	if c := cells["applied_response_lost/outbox_derived_key"]; c.CaptureCalls < 2 {
		t.Errorf("derived key under a lost answer: %d capture calls, want the redelivery replayed", c.CaptureCalls)
	}
	var md strings.Builder
	if err := m.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), md.String()) {
		t.Errorf("README.md lacks the effects matrix as it runs:\n%s", md.String())
	}
}

// TestWebhooksOfOneNamespaceDoNotWaitForAnother: globex floods the provider
// with captures of charges that rolled back, whose webhooks the lab answers
// 404 and the provider retries; acme's charge is paid meanwhile, while
// globex's webhooks are still being retried — no worker waits out a backoff.
func TestWebhooksOfOneNamespaceDoNotWaitForAnother(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	const flood = 64
	var wg sync.WaitGroup
	for range flood {
		wg.Go(func() {
			h := http.Header{"Authorization": {"Bearer " + labtest.Globex}, "Content-Type": {"application/json"}, lab.FaultHeader: {"outbox_fail"}}
			if r := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=unsafe", h, e2e.Body2500); r.Status != http.StatusServiceUnavailable {
				t.Errorf("a rolled-back charge: %d %s", r.Status, r.Body)
			}
		})
	}
	wg.Wait()
	r := labtest.Charge(t, a.URL(), "memory", labtest.Acme, "k-not-behind", e2e.Body2500)
	if r.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", r.Status, r.Body)
	}
	id := labtest.Decode[lab.Charge](t, r).ID
	labtest.Eventually(t, "acme's charge paid", func() bool {
		ps, err := a.Books().Payments(t.Context(), "acme", "", 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(ps) == 1 && ps[0].ChargeID == id && ps[0].State == lab.PaymentSucceeded
	})
	got, err := a.Provider().Stats(t.Context(), provider.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if got.WebhooksFailed >= 2*flood {
		t.Fatalf("acme was paid only after all %d of globex's webhooks were given up (%d): it waited behind them", 2*flood, got.WebhooksFailed)
	}
	t.Logf("acme paid while globex's webhooks were still retried: %d given up, %d refused so far", got.WebhooksFailed, got.WebhooksRejected)
}

// TestQueuedWebhooksCountTheProvidersQueue: held back by the provider,
// each capture's two webhooks wait in its queue once the relay has
// delivered the events; the lab counts them from its own provider's
// records, as the provider's stats do.
func TestQueuedWebhooksCountTheProvidersQueue(t *testing.T) {
	t.Parallel()
	ticked := testsignal.New() // after each turn of the lab's relay
	a := labtest.Start(t, e2e.EffectsConfig(t, func(c *app.Config) { c.Relay.Signals.Ticked = ticked }))
	ctx := t.Context()
	if queued, err := a.QueuedWebhooks(ctx); err != nil || queued != 0 {
		t.Fatalf("queued before any charge: %d, %v", queued, err)
	}
	if err := a.Provider().SetFaults(ctx, "acme", provider.Faults{WebhookDelayMS: provider.MaxWebhookDelayMS}); err != nil {
		t.Fatal(err)
	}
	const charges = 3
	e2e.OpenRun(t, a, "run-queued")
	chargeMany(t, a.URL(), postgres.Name, "run-queued", charges, nil)
	ticked.WaitUntil(t, "the run's events delivered", func() bool { return e2e.RunStats(t, a, "run-queued").Delivered == charges })
	queued, err := a.QueuedWebhooks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.Provider().Stats(ctx, provider.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if queued != 2*charges || queued != int64(st.WebhooksQueued) {
		t.Fatalf("queued %d, the provider's stats %d; want %d, two per capture", queued, st.WebhooksQueued, 2*charges)
	}
}
