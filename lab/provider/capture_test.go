package provider_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/provider"
)

func TestCapture(t *testing.T) {
	t.Parallel()
	t.Run("Created", func(t *testing.T) {
		e := setup(t, options{})
		req := captureReq("acme", "ch_1", 1250)
		r := e.post(t, "/captures", keyed("ch_1:capture", ""), body(req))
		if r.Status != http.StatusCreated || r.Header.Get(provider.ReplayedHeader) != "" {
			t.Fatalf("answer %d %v %q; want 201, not replayed", r.Status, r.Header, r.Body)
		}
		var got provider.Captured
		if err := json.Unmarshal(r.Body, &got); err != nil {
			t.Fatal(err)
		}
		c := got.Capture
		if got.Replayed || !strings.HasPrefix(c.ID, "cap_") || c.Key != "ch_1:capture" || c.ChargeID != "ch_1" || c.Tenant != "acme" ||
			c.Run != "run-1" || c.AmountCents != 1250 || c.Currency != "EUR" || c.Via != provider.ViaOutbox ||
			c.Status != provider.StatusSucceeded || c.Requests != 1 || c.CreatedAt.IsZero() {
			t.Fatalf("capture %+v", got)
		}
		if !strings.Contains(string(r.Body), `"replayed":false`) || strings.Contains(string(r.Body), "fingerprint") {
			t.Fatalf("body %s: want replayed false, no fingerprint", r.Body)
		}
	})
	t.Run("Replayed", func(t *testing.T) {
		e := setup(t, options{})
		req := captureReq("acme", "ch_1", 1250)
		first := e.post(t, "/captures", keyed("k", ""), body(req))
		req.Via = provider.ViaDirect // who sends it does not make it another request
		r := e.post(t, "/captures", keyed("k", ""), body(req))
		if r.Status != http.StatusOK || r.Header.Get(provider.ReplayedHeader) != "true" {
			t.Fatalf("answer %d %v %q; want 200 replayed", r.Status, r.Header, r.Body)
		}
		var a, b provider.Captured
		json.Unmarshal(first.Body, &a)
		json.Unmarshal(r.Body, &b)
		if !b.Replayed || b.ID != a.ID || b.Requests != 2 || b.Via != provider.ViaOutbox {
			t.Fatalf("replay %+v of %+v", b, a)
		}
		if s := e.stats(t, "acme"); s.CapturesApplied != 1 || s.CaptureRequests != 2 || s.CapturedCents != 1250 {
			t.Fatalf("stats %+v", s)
		}
	})
	t.Run("ErrKeyReused", func(t *testing.T) {
		e := setup(t, options{})
		e.post(t, "/captures", keyed("k", ""), body(captureReq("acme", "ch_1", 1250)))
		r := e.post(t, "/captures", keyed("k", ""), body(captureReq("acme", "ch_1", 1251)))
		problemOf(t, r, http.StatusUnprocessableEntity, "idempotency_key_reused")
		if s := e.stats(t, "acme"); s.CapturesApplied != 1 || s.CaptureRequests != 1 {
			t.Fatalf("stats %+v; want the first capture alone", s)
		}
	})
	t.Run("ErrKey", func(t *testing.T) {
		e := setup(t, options{})
		ok := body(captureReq("acme", "ch_1", 1250))
		problemOf(t, e.post(t, "/captures", keyed("", ""), ok), http.StatusBadRequest, "idempotency_key_missing")
		problemOf(t, e.post(t, "/captures", keyed(strings.Repeat("k", 256), ""), ok), http.StatusBadRequest, "idempotency_key_invalid")
		problemOf(t, e.post(t, "/captures", keyed("clé", ""), ok), http.StatusBadRequest, "idempotency_key_invalid")
		h := keyed("a", "")
		h.Add(provider.KeyHeader, "b")
		problemOf(t, e.post(t, "/captures", h, ok), http.StatusBadRequest, "idempotency_key_invalid")
		if r := e.post(t, "/captures", keyed(strings.Repeat("k", 255), ""), ok); r.Status != http.StatusCreated {
			t.Fatalf("a 255-character key: %d %s", r.Status, r.Body)
		}
	})
	t.Run("StrictBody", func(t *testing.T) {
		e := setup(t, options{})
		good := `{"charge_id":"ch_1","namespace":"acme","tenant":"acme","amount_cents":100,"currency":"USD","via":"outbox"}`
		for _, tt := range []struct {
			name, body string
			status     int
			code       string
		}{
			{"UnknownField", `{"charge_id":"ch_1","namespace":"acme","tenant":"acme","amount_cents":100,"currency":"USD","via":"outbox","memo":"x"}`, 400, "invalid_body"},
			{"TrailingObject", good + `{}`, 400, "invalid_body"},
			{"TrailingGarbage", good + `x`, 400, "invalid_body"},
			{"TooLarge", `{"charge_id":"` + strings.Repeat("c", provider.MaxBodyBytes) + `"}`, 413, "body_too_large"},
			{"Empty", ``, 400, "invalid_body"},
			{"NotAnObject", `[1]`, 400, "invalid_body"},
			{"Null", `null`, 400, "invalid_body"},
			{"ZeroAmount", strings.Replace(good, `100`, `0`, 1), 400, "invalid_body"},
			{"NegativeAmount", strings.Replace(good, `100`, `-5`, 1), 400, "invalid_body"},
			{"FractionalAmount", strings.Replace(good, `100`, `1.5`, 1), 400, "invalid_body"},
			{"StringAmount", strings.Replace(good, `100`, `"100"`, 1), 400, "invalid_body"},
			{"LowerCaseCurrency", strings.Replace(good, `USD`, `usd`, 1), 400, "invalid_body"},
			{"LongCurrency", strings.Replace(good, `USD`, `USDT`, 1), 400, "invalid_body"},
			{"UnknownVia", strings.Replace(good, `outbox`, `mail`, 1), 400, "invalid_body"},
			{"NoCharge", strings.Replace(good, `"ch_1"`, `""`, 1), 400, "invalid_body"},
			{"NoTenant", strings.Replace(good, `"acme"`, `""`, 1), 400, "invalid_body"},
			{"BadNamespace", strings.Replace(good, `"acme"`, `"ac me"`, 1), 400, "invalid_body"},
			{"ControlCharacter", strings.Replace(good, `"ch_1"`, `"ch\n1"`, 1), 400, "invalid_body"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				problemOf(t, e.post(t, "/captures", keyed("k-"+tt.name, ""), tt.body), tt.status, tt.code)
			})
		}
		if s := e.stats(t, ""); s.CapturesApplied != 0 || s.CaptureRequests != 0 {
			t.Fatalf("stats %+v; want nothing recorded", s)
		}
	})
}

// TestCaptureConcurrent: 32 requests with one key at one moment, spread
// over two providers that share their records (two replicas): exactly one
// applies. Within one provider an overlapping request is answered 409;
// across providers the records' unique key decides, and the others replay.
func TestCaptureConcurrent(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			records := b.open(t)
			replicas := []*env{setup(t, options{records: records}), setup(t, options{records: records})}
			const n = 32
			var (
				wg                         sync.WaitGroup
				start                      = make(chan struct{})
				mu                         sync.Mutex
				created, replayed, overlap int
				ids                        = map[string]bool{}
			)
			for i := range n {
				wg.Go(func() {
					<-start
					c, err := replicas[i%2].client.Capture(context.Background(), "ch_1:capture", captureReq("acme", "ch_1", 700), "")
					again := c.Replayed
					mu.Lock()
					defer mu.Unlock()
					var se *provider.StatusError
					switch {
					case errors.As(err, &se) && se.Status == http.StatusConflict && se.Code == "capture_in_progress":
						overlap++
					case err != nil:
						t.Errorf("capture: %v", err)
					case again:
						replayed++
						ids[c.ID] = true
					default:
						created++
						ids[c.ID] = true
					}
				})
			}
			close(start)
			wg.Wait()
			if created != 1 || len(ids) != 1 || created+replayed+overlap != n {
				t.Fatalf("%d created, %d replayed, %d in progress, %d capture ids; want 1 created, %d answers, 1 id",
					created, replayed, overlap, len(ids), n)
			}
			list, err := records.Captures(context.Background(), provider.Filter{})
			if err != nil || len(list) != 1 || list[0].Requests != created+replayed {
				t.Fatalf("records %+v, %v; want one capture of %d requests", list, err, created+replayed)
			}
			overlaps := replicas[0].p.Counters().InFlightOverlaps + replicas[1].p.Counters().InFlightOverlaps
			if overlaps != int64(overlap) {
				t.Fatalf("in_flight_overlaps %d, want %d (one per 409)", overlaps, overlap)
			}
		})
	}
}

func TestReceipts(t *testing.T) {
	t.Parallel()
	t.Run("Deduplicated", func(t *testing.T) {
		e := setup(t, options{})
		req := provider.ReceiptRequest{EventID: "0b4c6ad8-5c47-4f7a-9a9b-0f3d3b0b7a11", ChargeID: "ch_1", Namespace: "acme", Tenant: "acme", Run: "run-1", Via: provider.ViaOutbox}
		r := e.post(t, "/receipts", keyed("", ""), body(req))
		if r.Status != http.StatusCreated || !strings.Contains(string(r.Body), `"duplicate":false`) {
			t.Fatalf("first receipt: %d %s", r.Status, r.Body)
		}
		r = e.post(t, "/receipts", keyed("", ""), body(req))
		if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"duplicate":true`) {
			t.Fatalf("second receipt: %d %s", r.Status, r.Body)
		}
		if dup, err := e.client.Receipt(context.Background(), req, ""); err != nil || !dup {
			t.Fatalf("third receipt: duplicate %v, err %v", dup, err)
		}
		if s := e.stats(t, "acme"); s.Receipts != 1 || s.ReceiptDeliveries != 3 {
			t.Fatalf("stats %+v", s)
		}
	})
	t.Run("StrictBody", func(t *testing.T) {
		e := setup(t, options{})
		good := `{"event_id":"e1","charge_id":"ch_1","namespace":"acme","tenant":"acme","via":"direct"}`
		for name, b := range map[string]string{
			"UnknownField": `{"event_id":"e1","charge_id":"ch_1","namespace":"acme","tenant":"acme","via":"direct","x":1}`,
			"Trailing":     good + ` []`,
			"NoEvent":      strings.Replace(good, `"e1"`, `""`, 1),
			"NoTenant":     strings.Replace(good, `"acme"`, `""`, 1),
			"UnknownVia":   strings.Replace(good, `direct`, `pigeon`, 1),
		} {
			t.Run(name, func(t *testing.T) {
				problemOf(t, e.post(t, "/receipts", keyed("", ""), b), http.StatusBadRequest, "invalid_body")
			})
		}
		if s := e.stats(t, ""); s.Receipts != 0 {
			t.Fatalf("stats %+v; want nothing recorded", s)
		}
		if r := e.post(t, "/receipts", keyed("", ""), good); r.Status != http.StatusCreated {
			t.Fatalf("good receipt: %d %s", r.Status, r.Body)
		}
	})
}

// gated blocks the first call for a capture key or event id until
// released, to hold a request in flight.
type gated struct {
	provider.Records
	key     string
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGated(key string) *gated {
	return &gated{Records: provider.NewMemory(), key: key, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gated) hold(key string) {
	if key != g.key {
		return
	}
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.release
	}
}

func (g *gated) Capture(ctx context.Context, c provider.Capture, hooks []provider.Webhook, r *provider.Receipt) (provider.Captured, error) {
	g.hold(c.Key)
	return g.Records.Capture(ctx, c, hooks, r)
}

func (g *gated) Receipt(ctx context.Context, r provider.Receipt) (bool, error) {
	g.hold(r.EventID)
	return g.Records.Receipt(ctx, r)
}

func TestInFlightOverlap(t *testing.T) {
	t.Parallel()
	t.Run("Capture", func(t *testing.T) {
		g := newGated("slow")
		e := setup(t, options{records: g})
		type result struct {
			replayed bool
			err      error
		}
		done := make(chan result, 1)
		go func() {
			cp, err := e.client.Capture(context.Background(), "slow", captureReq("acme", "ch_1", 100), "")
			replayed := cp.Replayed
			done <- result{replayed, err}
		}()
		<-g.entered
		_, err := e.client.Capture(context.Background(), "slow", captureReq("acme", "ch_1", 100), "")
		statusError(t, err, http.StatusConflict, "capture_in_progress")
		// Another key, or the same key of another tenant, is not held up.
		if _, err := e.client.Capture(context.Background(), "fast", captureReq("acme", "ch_2", 100), ""); err != nil {
			t.Fatal(err)
		}
		if _, err := e.client.Capture(context.Background(), "slow", captureReq("globex", "ch_3", 100), ""); err != nil {
			t.Fatal(err)
		}
		close(g.release)
		if r := <-done; r.err != nil || r.replayed {
			t.Fatalf("the held capture: replayed %v, err %v; want applied", r.replayed, r.err)
		}
		if c := e.p.Counters(); c.InFlightOverlaps != 1 {
			t.Fatalf("in_flight_overlaps %d, want 1", c.InFlightOverlaps)
		}
		// Once answered, the key replays.
		if cp, err := e.client.Capture(context.Background(), "slow", captureReq("acme", "ch_1", 100), ""); err != nil || !cp.Replayed {
			t.Fatalf("after: replayed %v, err %v", cp.Replayed, err)
		}
	})
	t.Run("Receipt", func(t *testing.T) {
		g := newGated("evt-slow")
		e := setup(t, options{records: g})
		req := provider.ReceiptRequest{EventID: "evt-slow", ChargeID: "ch_1", Namespace: "acme", Tenant: "acme", Via: provider.ViaOutbox}
		done := make(chan error, 1)
		go func() {
			_, err := e.client.Receipt(context.Background(), req, "")
			done <- err
		}()
		<-g.entered
		// The overlapping delivery is counted and handled: the records
		// deduplicate by event id.
		if dup, err := e.client.Receipt(context.Background(), req, ""); err != nil || dup {
			t.Fatalf("overlapping receipt: duplicate %v, err %v; want recorded", dup, err)
		}
		close(g.release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if c := e.p.Counters(); c.InFlightOverlaps != 1 {
			t.Fatalf("in_flight_overlaps %d, want 1", c.InFlightOverlaps)
		}
		if s := e.stats(t, "acme"); s.Receipts != 1 || s.ReceiptDeliveries != 2 {
			t.Fatalf("stats %+v", s)
		}
	})
}

func TestQueries(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	ctx := context.Background()
	for i, tenant := range []string{"acme", "acme~2", "globex"} {
		req := captureReq(tenant, "ch_"+tenant, int64(100*(i+1)))
		req.Run = "run-" + tenant
		if _, err := e.client.Capture(ctx, "k", req, ""); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("Captures", func(t *testing.T) {
		list, err := e.client.Captures(ctx, provider.Filter{Namespace: "acme"})
		if err != nil || len(list) != 2 || list[0].Tenant != "acme~2" || list[1].Tenant != "acme" {
			t.Fatalf("Captures(acme) = %+v, %v", list, err)
		}
		list, err = e.client.Captures(ctx, provider.Filter{Run: "run-globex", Limit: 5})
		if err != nil || len(list) != 1 || list[0].Tenant != "globex" {
			t.Fatalf("Captures(run-globex) = %+v, %v", list, err)
		}
		list, err = e.client.Captures(ctx, provider.Filter{ChargeID: "ch_acme", Limit: 1})
		if err != nil || len(list) != 1 || list[0].ChargeID != "ch_acme" {
			t.Fatalf("Captures(ch_acme) = %+v, %v", list, err)
		}
		if r := e.do(t, http.MethodGet, "/captures?namespace=nobody", nil, ""); r.Status != 200 || string(r.Body) != "{\"captures\":[]}\n" {
			t.Fatalf("empty list: %d %q", r.Status, r.Body)
		}
		for _, q := range []string{"limit=0", "limit=1001", "limit=x", "namespace=a%20b"} {
			problemOf(t, e.do(t, http.MethodGet, "/captures?"+q, nil, ""), http.StatusBadRequest, "invalid_parameter")
		}
	})
	t.Run("Stats", func(t *testing.T) {
		r := e.do(t, http.MethodGet, "/stats?namespace=acme", nil, "")
		var fields map[string]any
		if err := json.Unmarshal(r.Body, &fields); err != nil || r.Status != 200 {
			t.Fatalf("stats: %d %s", r.Status, r.Body)
		}
		for _, f := range []string{"captures_applied", "capture_requests", "charges_captured_twice", "captured_cents", "receipts",
			"receipt_deliveries", "direct_captures", "in_flight_overlaps", "errors_injected", "responses_lost",
			"connections_dropped", "webhooks_sent", "webhooks_failed", "webhooks_rejected", "webhooks_queued", "webhooks_delivered", "webhooks_dead"} {
			if _, ok := fields[f]; !ok {
				t.Errorf("stats lack %s: %s", f, r.Body)
			}
		}
		if fields["captures_applied"] != 2.0 || fields["captured_cents"] != 300.0 {
			t.Fatalf("stats of acme: %s", r.Body)
		}
	})
	t.Run("Health", func(t *testing.T) {
		if err := e.client.Health(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Reset", func(t *testing.T) {
		if r := e.do(t, http.MethodDelete, "/namespaces/a%20b", nil, ""); r.Status != http.StatusBadRequest {
			t.Fatalf("reset of a bad namespace: %d", r.Status)
		}
		if err := e.client.Reset(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
		if s := e.stats(t, ""); s.CapturesApplied != 1 {
			t.Fatalf("after resetting acme: %+v", s)
		}
		if err := e.client.Reset(ctx, ""); err != nil {
			t.Fatal(err)
		}
		if s := e.stats(t, ""); s.CapturesApplied != 0 {
			t.Fatalf("after resetting all: %+v", s)
		}
	})
}

func TestNew(t *testing.T) {
	t.Parallel()
	m := provider.NewMemory()
	for name, cfg := range map[string]provider.Config{
		"NoRecords":        {APIKey: apiKey},
		"NoAPIKey":         {Records: m},
		"APIKeyWithSpace":  {Records: m, APIKey: "a key"},
		"NoSecret":         {Records: m, APIKey: apiKey, WebhookURL: "http://127.0.0.1:1/webhooks"},
		"RelativeURL":      {Records: m, APIKey: apiKey, Secret: secret, WebhookURL: "/webhooks"},
		"NegativeAttempts": {Records: m, APIKey: apiKey, WebhookAttempts: -1},
		"NegativeHold":     {Records: m, APIKey: apiKey, ResponseLostHold: -time.Second},
	} {
		if _, err := provider.New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
	if _, err := provider.New(provider.Config{Records: m, APIKey: apiKey}); err != nil {
		t.Fatalf("New with records and an API key alone: %v", err)
	}
}

func TestClientErrors(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	ctx := context.Background()
	_, err := e.client.Capture(ctx, "", captureReq("acme", "ch_1", 1), "")
	statusError(t, err, http.StatusBadRequest, "idempotency_key_missing")
	var se *provider.StatusError
	if errors.As(err, &se) && se.Detail == "" {
		t.Fatalf("no detail in %+v", se)
	}
	// Nothing listens: a transport error, wrapped.
	dead := provider.NewClient("http://127.0.0.1:1/provider", apiKey, e.hc)
	_, err = dead.Capture(ctx, "k", captureReq("acme", "ch_1", 1), "")
	transportError(t, err)
	var oe interface{ Timeout() bool }
	if !errors.As(err, &oe) {
		t.Fatalf("err %v does not wrap the transport's error", err)
	}
}
