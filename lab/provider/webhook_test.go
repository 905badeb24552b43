package provider_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/signature"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

// expect checks the next webhooks' types and signatures, in order.
func (e *env) expect(t *testing.T, c provider.Capture, want ...string) []hook {
	t.Helper()
	var got []hook
	for i, typ := range want {
		h := e.next(t)
		got = append(got, h)
		if h.Event.Type != typ {
			t.Fatalf("webhook %d is %s, want %s (all: %v)", i+1, h.Event.Type, typ, want)
		}
		d := h.Event.Data
		if d.CaptureID != c.ID || d.ChargeID != c.ChargeID || d.Tenant != c.Tenant || d.Run != c.Run ||
			d.AmountCents != c.AmountCents || d.Currency != c.Currency || h.Event.Created == 0 {
			t.Fatalf("webhook %d: %+v, want the data of %+v", i+1, h.Event, c)
		}
	}
	return got
}

func TestWebhooks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("SignedInOrder", func(t *testing.T) {
		e := setup(t, options{webhooks: true})
		c, err := e.client.Capture(ctx, "k1", captureReq("acme", "ch_1", 100), "")
		if err != nil {
			t.Fatal(err)
		}
		hs := e.expect(t, c.Capture, provider.EventCaptureProcessing, provider.EventCaptureSucceeded)
		for _, h := range hs {
			if h.Verified != nil {
				t.Fatalf("webhook %s does not verify: %v", h.Event.Type, h.Verified)
			}
		}
		if hs[0].Event.ID == hs[1].Event.ID || hs[0].Event.Data.Status != "processing" || hs[1].Event.Data.Status != provider.StatusSucceeded {
			t.Fatalf("webhooks %+v", hs)
		}
		// A replay sends nothing: the next webhooks are another capture's.
		if cp, err := e.client.Capture(ctx, "k1", captureReq("acme", "ch_1", 100), ""); err != nil || !cp.Replayed {
			t.Fatalf("replay: %v, %v", cp.Replayed, err)
		}
		c2, err := e.client.Capture(ctx, "k2", captureReq("acme", "ch_2", 200), "")
		if err != nil {
			t.Fatal(err)
		}
		e.expect(t, c2.Capture, provider.EventCaptureProcessing, provider.EventCaptureSucceeded)
		e.eventually(t, "4 webhooks sent", func(c provider.Counters) bool { return c.WebhooksSent == 4 })
	})
	t.Run("Declined", func(t *testing.T) {
		e := setup(t, options{webhooks: true})
		c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "decline")
		if err != nil {
			t.Fatal(err)
		}
		hs := e.expect(t, c.Capture, provider.EventCaptureProcessing, provider.EventCaptureFailed)
		if hs[1].Event.Data.Status != provider.StatusFailed {
			t.Fatalf("final webhook %+v", hs[1].Event)
		}
	})
	t.Run("Duplicate", func(t *testing.T) {
		e := setup(t, options{webhooks: true})
		c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "webhook_duplicate")
		if err != nil {
			t.Fatal(err)
		}
		hs := e.expect(t, c.Capture, provider.EventCaptureProcessing, provider.EventCaptureSucceeded, provider.EventCaptureSucceeded)
		if hs[1].Event != hs[2].Event || hs[2].Attempt != 2 || hs[2].Verified != nil {
			t.Fatalf("duplicate %+v of %+v: want the same event, signed", hs[2], hs[1])
		}
	})
	t.Run("Reorder", func(t *testing.T) {
		e := setup(t, options{webhooks: true})
		if err := e.client.SetFaults(ctx, "acme", provider.Faults{WebhookReorder: true}); err != nil {
			t.Fatal(err)
		}
		c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "")
		if err != nil {
			t.Fatal(err)
		}
		e.expect(t, c.Capture, provider.EventCaptureSucceeded, provider.EventCaptureProcessing)
	})
	t.Run("BadSignature", func(t *testing.T) {
		e := setup(t, options{webhooks: true})
		c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "webhook_bad_signature")
		if err != nil {
			t.Fatal(err)
		}
		hs := e.expect(t, c.Capture, provider.EventCaptureProcessing, provider.EventCaptureSucceeded, provider.EventCaptureSucceeded)
		if hs[0].Verified != nil || !errors.Is(hs[1].Verified, signature.ErrMismatch) || hs[2].Verified != nil || hs[1].Event != hs[2].Event {
			t.Fatalf("verdicts %v, %v, %v; want the forged copy refused and the genuine event accepted",
				hs[0].Verified, hs[1].Verified, hs[2].Verified)
		}
		e.eventually(t, "the forged copy refused, not retried", func(c provider.Counters) bool {
			return c.WebhooksSent == 2 && c.WebhooksRejected == 1 && c.WebhooksFailed == 1
		})
	})
	t.Run("Retried", func(t *testing.T) {
		// The receiver answers these statuses in turn: each is worth
		// another attempt.
		answers := []int{http.StatusServiceUnavailable, http.StatusOK, // processing
			http.StatusNotFound, http.StatusTooManyRequests, http.StatusOK, // succeeded
			http.StatusOK} // its duplicate
		n := 0
		e := setup(t, options{webhooks: true, attempts: 3, answer: func(hook) int {
			n++
			return answers[min(n, len(answers))-1]
		}})
		c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "webhook_duplicate")
		if err != nil {
			t.Fatal(err)
		}
		hs := e.expect(t, c.Capture, provider.EventCaptureProcessing, provider.EventCaptureProcessing,
			provider.EventCaptureSucceeded, provider.EventCaptureSucceeded, provider.EventCaptureSucceeded, provider.EventCaptureSucceeded)
		for i, want := range []int{1, 2, 1, 2, 3, 4} {
			if hs[i].Attempt != want {
				t.Fatalf("webhook %d arrived for the %d. time, want %d", i+1, hs[i].Attempt, want)
			}
		}
		e.eventually(t, "retries then deliveries", func(c provider.Counters) bool {
			return c.WebhooksSent == 3 && c.WebhooksRejected == 3 && c.WebhooksFailed == 0
		})
	})
	t.Run("NotRetried", func(t *testing.T) {
		e := setup(t, options{webhooks: true, answer: func(h hook) int {
			if h.Event.Type == provider.EventCaptureProcessing {
				return http.StatusBadRequest
			}
			return http.StatusOK
		}})
		c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "")
		if err != nil {
			t.Fatal(err)
		}
		// Refused for good, the processing event is not sent again; the
		// final one follows.
		e.expect(t, c.Capture, provider.EventCaptureProcessing, provider.EventCaptureSucceeded)
		e.eventually(t, "one given up, one sent", func(c provider.Counters) bool {
			return c.WebhooksFailed == 1 && c.WebhooksRejected == 1 && c.WebhooksSent == 1
		})
	})
	t.Run("AttemptsExhausted", func(t *testing.T) {
		e := setup(t, options{webhooks: true, attempts: 2, answer: func(hook) int { return http.StatusInternalServerError }})
		c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "")
		if err != nil {
			t.Fatal(err)
		}
		e.expect(t, c.Capture, provider.EventCaptureProcessing, provider.EventCaptureProcessing,
			provider.EventCaptureSucceeded, provider.EventCaptureSucceeded)
		e.eventually(t, "both given up", func(c provider.Counters) bool {
			return c.WebhooksFailed == 2 && c.WebhooksRejected == 4 && c.WebhooksSent == 0
		})
	})
}

// TestRunStops: Run returns once its workers stopped; what it did not
// deliver stays in the records, and another provider on them delivers it.
// goleak (TestMain) checks nothing is left running.
func TestRunStops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range backends() {
		t.Run("UndeliveredKept/"+b.name, func(t *testing.T) {
			e := setup(t, options{webhooks: true, noRun: true, records: b.open(t)})
			var caps []provider.Capture
			for i, key := range []string{"k1", "k2"} {
				c, err := e.client.Capture(ctx, key, captureReq("acme", "ch_"+key, int64(100+i)), "")
				if err != nil {
					t.Fatal(err)
				}
				caps = append(caps, c.Capture)
			}
			stopped, cancel := context.WithCancel(ctx)
			cancel()
			e.p.Run(stopped)
			e.p.Run(ctx) // a second Run returns at once
			if c := e.p.Counters(); c.WebhooksSent != 0 {
				t.Fatalf("counters %+v; want nothing sent", c)
			}
			if s := e.stats(t, ""); s.WebhooksQueued != 4 {
				t.Fatalf("stats %+v; want the 4 webhooks kept", s)
			}
			// The next provider on the records sends them, each capture's in order.
			next, err := provider.New(e.cfg)
			if err != nil {
				t.Fatal(err)
			}
			run(t, next)
			got := map[string][]string{}
			for range 4 {
				h := e.next(t)
				got[h.Event.Data.CaptureID] = append(got[h.Event.Data.CaptureID], h.Event.Type)
			}
			for _, c := range caps {
				if want := []string{provider.EventCaptureProcessing, provider.EventCaptureSucceeded}; !slices.Equal(got[c.ID], want) {
					t.Fatalf("capture %s: webhooks %v, want %v", c.ID, got[c.ID], want)
				}
			}
			eventuallyStats(t, e, "every webhook delivered", func(s provider.Stats) bool { return s.WebhooksQueued == 0 && s.WebhooksDelivered == 4 })
		})
	}
	t.Run("WhileSending", func(t *testing.T) {
		// The receiver holds every webhook until its request ends (which
		// the server notices once the body was read).
		entered := make(chan struct{}, 10)
		recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			entered <- struct{}{}
			<-r.Context().Done()
		}))
		t.Cleanup(recv.Close)
		records := provider.NewMemory()
		p, err := provider.New(provider.Config{Records: records, APIKey: apiKey, Secret: secret, WebhookURL: recv.URL,
			HTTPClient: recv.Client(), Logger: slog.New(slog.DiscardHandler), WebhookWorkers: 1})
		if err != nil {
			t.Fatal(err)
		}
		stop := running(t, ctx, p)
		e := serve(t, p)
		if _, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), ""); err != nil {
			t.Fatal(err)
		}
		<-entered
		stop()
		if c := p.Counters(); c.WebhooksFailed != 0 || c.WebhooksSent != 0 {
			t.Fatalf("counters %+v; want nothing given up", c)
		}
		// The interrupted webhook was released, due now, and the next waits behind it.
		claimed, err := records.ClaimWebhooks(ctx, time.Now(), 10, time.Minute)
		if err != nil || len(claimed) != 1 || claimed[0].Type != provider.EventCaptureProcessing || claimed[0].Attempts != 2 {
			t.Fatalf("claimable after the stop: %+v, %v; want the interrupted processing webhook", claimed, err)
		}
	})
	t.Run("HeldAnswerLetGo", func(t *testing.T) {
		cfg := provider.Config{Records: provider.NewMemory(), APIKey: apiKey, Logger: slog.New(slog.DiscardHandler),
			Signals: provider.Signals{Counted: testsignal.New()}}
		p, err := provider.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		stop := running(t, ctx, p)
		e := serve(t, p)
		e.cfg = cfg
		answered := make(chan error, 1)
		go func() {
			_, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "applied_response_lost")
			answered <- err
		}()
		e.eventually(t, "the answer withheld", func(c provider.Counters) bool { return c.ResponsesLost == 1 })
		stop()
		transportError(t, testsignal.Receive(t, "the withheld answer let go as the provider stopped", answered))
	})
}

// eventuallyStats waits until the records' figures satisfy ok: a
// webhook's completion is recorded after the receiver answered it, and
// the provider signals once it is.
func eventuallyStats(t *testing.T, e *env, what string, ok func(provider.Stats) bool) {
	t.Helper()
	e.cfg.Signals.Counted.WaitUntil(t, what, func() bool { return ok(e.stats(t, "")) })
}

// TestWebhookWindow: a webhook the lab never acknowledges is retried with
// backoff until its window ends, then dead, counted and kept in the
// records; the next one of its capture follows it.
func TestWebhookWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, options{webhooks: true, window: 100 * time.Millisecond, answer: func(hook) int { return http.StatusServiceUnavailable }})
	c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for seen[provider.EventCaptureSucceeded] == 0 {
		h := e.next(t)
		if h.Event.Data.CaptureID != c.ID {
			t.Fatalf("webhook of another capture: %+v", h.Event)
		}
		seen[h.Event.Type]++
	}
	if seen[provider.EventCaptureProcessing] < 2 {
		t.Fatalf("processing sent %d times before the final one: want retries within its window", seen[provider.EventCaptureProcessing])
	}
	e.eventually(t, "both given up", func(c provider.Counters) bool { return c.WebhooksFailed == 2 && c.WebhooksSent == 0 })
	if s := e.stats(t, "acme"); s.WebhooksDead != 2 || s.WebhooksQueued != 0 {
		t.Fatalf("stats %+v; want both webhooks dead", s)
	}
}

// TestWebhookDelay: webhook_delay_ms holds a capture's webhooks back.
func TestWebhookDelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, options{webhooks: true})
	start := time.Now()
	c, err := e.client.Capture(ctx, "k", captureReq("acme", "ch_1", 100), "webhook_delay_ms=300")
	if err != nil {
		t.Fatal(err)
	}
	e.expect(t, c.Capture, provider.EventCaptureProcessing, provider.EventCaptureSucceeded)
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("the webhooks came after %s, before their 300ms delay", took)
	}
}

// running runs p's background work until the returned stop, which waits
// for Run to return and fails the test if it does not within
// testsignal.Timeout.
func running(t *testing.T, ctx context.Context, p *provider.Provider) (stop func()) {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(runCtx)
	}()
	return func() {
		t.Helper()
		cancel()
		testsignal.Receive(t, "Run returning", done)
	}
}
