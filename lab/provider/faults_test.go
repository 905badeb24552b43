package provider_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/provider"
)

func TestFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("Down", func(t *testing.T) {
		e := setup(t, options{})
		_, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "down")
		transportError(t, err)
		_, err = e.client.Receipt(ctx, provider.ReceiptRequest{EventID: "e1", ChargeID: "ch_1", Namespace: "acme", Tenant: "acme", Via: "outbox"}, "down")
		transportError(t, err)
		if s := e.stats(t, ""); s != (provider.Stats{}) {
			t.Fatalf("stats %+v; want nothing recorded", s)
		}
		if c := e.p.Counters(); c.ConnectionsDropped != 2 {
			t.Fatalf("connections_dropped %d, want 2", c.ConnectionsDropped)
		}
		// Down acts before anything is read: even a request it would refuse.
		_, err = e.client.Capture(ctx, "", provider.CaptureRequest{}, "down")
		transportError(t, err)
	})
	t.Run("DownStanding", func(t *testing.T) {
		e := setup(t, options{})
		if err := e.client.SetFaults(ctx, "acme", provider.Faults{Down: true}); err != nil {
			t.Fatal(err)
		}
		_, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "")
		transportError(t, err)
		if s := e.stats(t, ""); s.CapturesApplied != 0 {
			t.Fatalf("stats %+v; want nothing recorded", s)
		}
	})
	t.Run("ErrorRate", func(t *testing.T) {
		e := setup(t, options{})
		_, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "error_rate=1")
		statusError(t, err, http.StatusServiceUnavailable, "provider_unavailable")
		_, err = e.client.Receipt(ctx, provider.ReceiptRequest{EventID: "e1", ChargeID: "ch_1", Namespace: "acme", Tenant: "acme", Via: "outbox"}, "error_rate=1")
		statusError(t, err, http.StatusServiceUnavailable, "provider_unavailable")
		if s := e.stats(t, ""); s != (provider.Stats{}) {
			t.Fatalf("stats %+v; want nothing recorded", s)
		}
		if c := e.p.Counters(); c.ErrorsInjected != 2 {
			t.Fatalf("errors_injected %d, want 2", c.ErrorsInjected)
		}
		// The same key is then applied: the failure recorded nothing.
		if cp, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), ""); err != nil || cp.Replayed {
			t.Fatalf("retry: replayed %v, err %v; want applied", cp.Replayed, err)
		}
	})
	t.Run("ErrorRateDraws", func(t *testing.T) {
		e := setup(t, options{rand: func() float64 { return 0.2 }})
		_, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "error_rate=0.3")
		statusError(t, err, http.StatusServiceUnavailable, "provider_unavailable")
		if _, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "error_rate=0.1"); err != nil {
			t.Fatalf("a draw of 0.2 against 0.1: %v", err)
		}
	})
	t.Run("AppliedResponseLost", func(t *testing.T) {
		e := setup(t, options{})
		impatient := provider.NewClient(e.base, apiKey, &http.Client{Transport: e.hc.Transport, Timeout: 200 * time.Millisecond})
		_, err := impatient.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "applied_response_lost")
		transportError(t, err)
		if s := e.stats(t, "acme"); s.CapturesApplied != 1 {
			t.Fatalf("stats %+v; want the capture applied", s)
		}
		e.eventually(t, "the lost answer's dropped connection", func(c provider.Counters) bool {
			return c.ResponsesLost == 1 && c.ConnectionsDropped == 1
		})
		// The retry learns the outcome.
		if c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), ""); err != nil || !c.Replayed || c.Requests != 2 {
			t.Fatalf("retry: %+v, replayed %v, err %v; want a replay", c, c.Replayed, err)
		}
		// A receipt is applied too.
		req := provider.ReceiptRequest{EventID: "e1", ChargeID: "ch_1", Namespace: "acme", Tenant: "acme", Via: "outbox"}
		_, err = impatient.Receipt(ctx, req, "applied_response_lost=1")
		transportError(t, err)
		if dup, err := e.client.Receipt(ctx, req, ""); err != nil || !dup {
			t.Fatalf("receipt retry: duplicate %v, err %v; want a duplicate", dup, err)
		}
	})
	t.Run("AppliedResponseLostHoldEnds", func(t *testing.T) {
		e := setup(t, options{hold: 20 * time.Millisecond})
		_, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "applied_response_lost")
		transportError(t, err)
		if s := e.stats(t, "acme"); s.CapturesApplied != 1 {
			t.Fatalf("stats %+v; want the capture applied", s)
		}
	})
	t.Run("AppliedResponseLostDraws", func(t *testing.T) {
		e := setup(t, options{rand: func() float64 { return 0.7 }})
		if _, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "applied_response_lost=0.5"); err != nil {
			t.Fatalf("a draw of 0.7 against 0.5: %v", err)
		}
	})
	t.Run("Latency", func(t *testing.T) {
		e := setup(t, options{})
		start := time.Now()
		if _, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "latency_ms=150"); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < 150*time.Millisecond {
			t.Fatalf("answered in %v, want at least 150ms", took)
		}
		// A client that gives up during the wait leaves nothing recorded.
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := e.client.Capture(short, "k2", captureReq("acme", "ch_2", 100), "latency_ms=10000")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v, want the deadline", err)
		}
		if list, err := e.client.Captures(ctx, provider.Filter{ChargeID: "ch_2"}); err != nil || len(list) != 0 {
			t.Fatalf("captures of ch_2: %+v, %v; want none", list, err)
		}
	})
	t.Run("Decline", func(t *testing.T) {
		e := setup(t, options{})
		c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "decline")
		if err != nil || c.Status != provider.StatusFailed {
			t.Fatalf("declined capture %+v, %v; want status failed", c, err)
		}
		if s := e.stats(t, "acme"); s.CapturesApplied != 1 || s.CapturedCents != 0 {
			t.Fatalf("stats %+v; want one capture, nothing captured", s)
		}
		// A replay answers what was recorded, whatever the faults now.
		if c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), ""); err != nil || !c.Replayed || c.Status != provider.StatusFailed {
			t.Fatalf("replay %+v, %v, %v", c, c.Replayed, err)
		}
	})
	t.Run("ErrInvalidFault", func(t *testing.T) {
		e := setup(t, options{})
		for _, f := range []string{"explode", "down=1", "error_rate=2", "error_rate", "latency_ms=-1", "latency_ms=10001",
			"applied_response_lost=NaN", "down,down", "webhook_delay_ms", "webhook_delay_ms=-1", "webhook_delay_ms=600001"} {
			_, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), f)
			statusError(t, err, http.StatusBadRequest, "invalid_fault")
			_, err = e.client.Receipt(ctx, provider.ReceiptRequest{EventID: "e", ChargeID: "c", Namespace: "acme", Tenant: "acme", Via: "outbox"}, f)
			statusError(t, err, http.StatusBadRequest, "invalid_fault")
		}
		if s := e.stats(t, ""); s != (provider.Stats{}) {
			t.Fatalf("stats %+v; want nothing recorded", s)
		}
	})
}

// TestFaultsPerNamespace: a namespace's standing faults touch its own
// tenants' requests (both of them) and no one else's, and a request's
// header overrides them.
func TestFaultsPerNamespace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, options{})
	if err := e.client.SetFaults(ctx, "acme", provider.Faults{ErrorRate: 1, Decline: true}); err != nil {
		t.Fatal(err)
	}
	if err := e.client.SetFaults(ctx, "initech", provider.Faults{Down: true}); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"acme", "acme~2"} {
		_, err := e.client.Capture(ctx, "k", captureReq(tenant, "ch_"+tenant, 100), "")
		statusError(t, err, http.StatusServiceUnavailable, "provider_unavailable")
	}
	_, err := e.client.Capture(ctx, "k", captureReq("initech", "ch_i", 100), "")
	transportError(t, err)
	// Another namespace's requests, even with the same key, are untouched.
	c, err := e.client.Capture(ctx, "k", captureReq("globex", "ch_g", 100), "")
	if err != nil || c.Status != provider.StatusSucceeded {
		t.Fatalf("globex: %+v, %v", c, err)
	}
	// The header overrides the standing error_rate; the standing decline stays.
	c, err = e.client.Capture(ctx, "k", captureReq("acme", "ch_acme", 100), "error_rate=0")
	if err != nil || c.Status != provider.StatusFailed {
		t.Fatalf("acme with error_rate=0: %+v, %v; want a declined capture", c, err)
	}
	if err := e.client.ClearFaults(ctx, "initech"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Capture(ctx, "k", captureReq("initech", "ch_i", 100), ""); err != nil {
		t.Fatalf("initech after clearing: %v", err)
	}
	if s := e.stats(t, "globex"); s.CapturesApplied != 1 || s.CapturedCents != 100 {
		t.Fatalf("globex stats %+v", s)
	}
}

func TestFaultsAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, options{})
	want := provider.Faults{ErrorRate: 0.25, LatencyMS: 30, AppliedResponseLost: 0.5, WebhookReorder: true}
	if err := e.client.SetFaults(ctx, "acme", want); err != nil {
		t.Fatal(err)
	}
	if got, err := e.client.Faults(ctx, "acme"); err != nil || got != want {
		t.Fatalf("Faults(acme) = %+v, %v; want %+v", got, err, want)
	}
	if got, err := e.client.Faults(ctx, "globex"); err != nil || got != (provider.Faults{}) {
		t.Fatalf("Faults(globex) = %+v, %v; want none", got, err)
	}
	for _, b := range []string{`{"error_rate":1.5}`, `{"error_rate":-0.1}`, `{"latency_ms":10001}`, `{"applied_response_lost":2}`, `{"webhook_delay_ms":600001}`,
		`{"down":true,"crash":true}`, `{"down":"yes"}`, `{} {}`} {
		r := e.do(t, http.MethodPut, "/faults/acme", http.Header{"Content-Type": {"application/json"}}, b)
		problemOf(t, r, http.StatusBadRequest, "invalid_body")
	}
	problemOf(t, e.do(t, http.MethodPut, "/faults/a%21", nil, `{}`), http.StatusBadRequest, "invalid_parameter")
	if got, _ := e.client.Faults(ctx, "acme"); got != want {
		t.Fatalf("refused updates changed the faults: %+v", got)
	}
	if err := e.client.ClearFaults(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if got, err := e.client.Faults(ctx, "acme"); err != nil || got != (provider.Faults{}) {
		t.Fatalf("after clearing: %+v, %v", got, err)
	}
}

func TestFaultsHeader(t *testing.T) {
	t.Parallel()
	for _, f := range []provider.Faults{
		{},
		{Down: true},
		{ErrorRate: 0.3, LatencyMS: 50},
		{AppliedResponseLost: 1, Decline: true},
		{AppliedResponseLost: 0.125, WebhookDuplicate: true, WebhookReorder: true, WebhookBadSignature: true},
		{ErrorRate: 1.0 / 3, LatencyMS: provider.MaxLatencyMS},
		{WebhookDelayMS: provider.MaxWebhookDelayMS, WebhookReorder: true},
	} {
		got, err := provider.ParseFaults(f.String())
		if err != nil || got != f {
			t.Errorf("ParseFaults(%q) = %+v, %v; want %+v", f.String(), got, err, f)
		}
	}
	for h, want := range map[string]provider.Faults{
		" down , decline ":          {Down: true, Decline: true},
		"applied_response_lost":     {AppliedResponseLost: 1},
		"applied_response_lost=0.5": {AppliedResponseLost: 0.5},
		"error_rate=0,latency_ms=0": {},
		",,webhook_reorder,":        {WebhookReorder: true},
		"webhook_delay_ms=2500":     {WebhookDelayMS: 2500},
	} {
		if got, err := provider.ParseFaults(h); err != nil || got != want {
			t.Errorf("ParseFaults(%q) = %+v, %v; want %+v", h, got, err, want)
		}
	}
	if got := (provider.Faults{Down: true, ErrorRate: 0.3, LatencyMS: 50}).String(); got != "down,error_rate=0.3,latency_ms=50" {
		t.Errorf("String = %q", got)
	}
}

func FuzzParseFaults(f *testing.F) {
	for _, s := range []string{"down", "error_rate=0.3,latency_ms=50", "applied_response_lost", "x=1,,", "error_rate=1e-3", "latency_ms=+5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		got, err := provider.ParseFaults(h)
		if err != nil {
			return
		}
		if err := got.Validate(); err != nil {
			t.Fatalf("ParseFaults(%q) accepted invalid faults %+v: %v", h, got, err)
		}
		if math.IsNaN(got.ErrorRate) || math.IsNaN(got.AppliedResponseLost) {
			t.Fatalf("NaN accepted from %q", h)
		}
		again, err := provider.ParseFaults(got.String())
		if err != nil || again != got {
			t.Fatalf("%q → %+v → %q → %+v, %v", h, got, got.String(), again, err)
		}
	})
}
