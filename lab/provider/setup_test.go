package provider_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/signature"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

var secret = []byte("whsec_provider_test")

// apiKey is the test providers' API key.
const apiKey = "provider-test-key"

// options shape a test's provider.
type options struct {
	records provider.Records // default: memory
	// webhooks starts a receiver that verifies each webhook and answers
	// answer's status (default 200, and 401 to a bad signature).
	webhooks bool
	answer   func(h hook) int
	rand     func() float64 // default: always 0.5
	hold     time.Duration  // ResponseLostHold, default 10s
	attempts int
	window   time.Duration // WebhookWindow, default 10m
	noRun    bool          // the test runs the provider itself
}

// hook is one webhook the receiver got.
type hook struct {
	Event    provider.WebhookEvent
	Verified error // signature.Verify's verdict
	Attempt  int   // how many times this event id arrived, this one included
}

type env struct {
	p      *provider.Provider
	cfg    provider.Config // p's, for another provider on the same records and receiver
	base   string          // where the routes are mounted
	client *provider.Client
	hc     *http.Client
	hooks  chan hook
}

// setup serves a provider under /provider on a real HTTP server, runs its
// webhook sender until the test ends, and receives its webhooks.
func setup(t *testing.T, o options) *env {
	t.Helper()
	if o.records == nil {
		o.records = provider.NewMemory()
	}
	if o.rand == nil {
		o.rand = func() float64 { return 0.5 }
	}
	cfg := provider.Config{
		Records: o.records, APIKey: apiKey, Secret: secret, Logger: slog.New(slog.DiscardHandler), Rand: o.rand,
		WebhookAttempts: o.attempts, WebhookWindow: o.window, WebhookBackoff: time.Millisecond, WebhookWorkers: 1,
		WebhookPoll: 10 * time.Millisecond, ResponseLostHold: o.hold,
		Signals: provider.Signals{Counted: testsignal.New()},
	}
	hooks := make(chan hook, 100)
	if o.webhooks {
		recv := httptest.NewServer(receiver(hooks, o.answer))
		t.Cleanup(recv.Close)
		cfg.WebhookURL = recv.URL + "/webhooks/provider"
		cfg.HTTPClient = recv.Client()
	}
	p, err := provider.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := serve(t, p)
	e.hooks, e.cfg = hooks, cfg
	if !o.noRun {
		run(t, p)
	}
	return e
}

// run runs p until the test ends.
func run(t *testing.T, p *provider.Provider) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// serve mounts p under /provider on a real HTTP server until the test ends.
func serve(t *testing.T, p *provider.Provider) *env {
	t.Helper()
	ech := echo.New()
	p.Register(ech.Group("/provider"))
	srv := httptest.NewServer(ech)
	t.Cleanup(srv.Close)
	e := &env{p: p, base: srv.URL + "/provider", hc: srv.Client()}
	e.client = provider.NewClient(e.base, apiKey, e.hc)
	return e
}

// receiver is the lab's side of the webhooks, as far as a test needs it.
func receiver(hooks chan<- hook, answer func(hook) int) http.Handler {
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var h hook
		h.Verified = signature.Verify(secret, r.Header.Get(signature.Header), body, time.Now(), 5*time.Minute)
		if err := json.Unmarshal(body, &h.Event); err != nil || r.Header.Get("Content-Type") != "application/json" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		status := http.StatusOK
		if h.Verified != nil {
			status = http.StatusUnauthorized
		}
		mu.Lock() // answer may keep state of its own
		seen[h.Event.ID]++
		h.Attempt = seen[h.Event.ID]
		if answer != nil {
			status = answer(h)
		}
		mu.Unlock()
		select {
		case hooks <- h:
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(status)
	})
}

// next waits for the next webhook.
func (e *env) next(t *testing.T) hook {
	t.Helper()
	return testsignal.Receive(t, "a webhook", e.hooks)
}

// eventually waits until the counters satisfy ok: they move after the
// answer a test waits on, so it re-checks each time the provider signals
// that it counted.
func (e *env) eventually(t *testing.T, what string, ok func(provider.Counters) bool) {
	t.Helper()
	e.cfg.Signals.Counted.WaitUntil(t, what, func() bool { return ok(e.p.Counters()) })
}

// post sends a raw request to a route of the provider.
func (e *env) post(t *testing.T, path string, header http.Header, body string) labtest.Reply {
	t.Helper()
	return e.do(t, http.MethodPost, path, header, body)
}

func (e *env) do(t *testing.T, method, path string, header http.Header, body string) labtest.Reply {
	t.Helper()
	req, err := http.NewRequest(method, e.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.GetBody = nil // the transport never resends: each request the provider counts is the test's
	req.Header.Set("Authorization", "Bearer "+apiKey)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return labtest.Reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// keyed is a header with an Idempotency-Key and maybe a Provider-Fault.
func keyed(key, fault string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}}
	if key != "" {
		h.Set(provider.KeyHeader, key)
	}
	if fault != "" {
		h.Set(provider.FaultHeader, fault)
	}
	return h
}

// problemOf checks that r is the problem status with code, and says why.
func problemOf(t *testing.T, r labtest.Reply, status int, code string) {
	t.Helper()
	if p := labtest.Problem(t, r); r.Status != status || p.Code != code || p.Detail == "" {
		t.Fatalf("answer %d %q; want %d with code %s and a detail", r.Status, r.Body, status, code)
	}
}

func captureReq(tenant, charge string, cents int64) provider.CaptureRequest {
	return provider.CaptureRequest{ChargeID: charge, Namespace: string(lab.NamespaceOf(tenant)), Tenant: tenant, Run: "run-1", AmountCents: cents, Currency: "EUR", Via: provider.ViaOutbox}
}

func body(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// stats reads the records' figures for a namespace.
func (e *env) stats(t *testing.T, ns string) provider.Stats {
	t.Helper()
	s, err := e.client.Stats(context.Background(), provider.Filter{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	return s.Stats
}

// transportError asserts err is a failure to get any answer at all.
func transportError(t *testing.T, err error) {
	t.Helper()
	var se *provider.StatusError
	if err == nil || errors.As(err, &se) {
		t.Fatalf("err = %v; want a transport error (no answer)", err)
	}
}

func statusError(t *testing.T, err error, status int, code string) {
	t.Helper()
	var se *provider.StatusError
	if !errors.As(err, &se) || se.Status != status || se.Code != code {
		t.Fatalf("err = %v; want %d %s", err, status, code)
	}
}
