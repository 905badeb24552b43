package provider_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/signature"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

// gatherer is a lab's webhook route that holds every webhook until width
// of them are in flight at once, then lets them all through: it answers
// only if the provider truly sends concurrently. It counts the most in
// flight at once, the connections it was sent over, and each capture's
// webhooks in the order they arrived.
type gatherer struct {
	width int
	all   chan struct{}
	conns atomic.Int32

	mu       sync.Mutex
	inFlight int
	peak     int
	types    map[string][]string // capture id → event types, as they arrived
	bad      []string            // what did not verify
}

func newGatherer(t *testing.T, width int) (*gatherer, string) {
	g := &gatherer{width: width, all: make(chan struct{}), types: map[string][]string{}}
	srv := httptest.NewUnstartedServer(g)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			g.conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return g, srv.URL + "/webhooks/provider"
}

func (g *gatherer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var ev provider.WebhookEvent
	verified := signature.Verify(secret, r.Header.Get(signature.Header), body, time.Now(), 5*time.Minute)
	g.mu.Lock()
	if err := json.Unmarshal(body, &ev); err != nil || verified != nil {
		g.bad = append(g.bad, fmt.Sprintf("%s: %v %v", body, err, verified))
	}
	g.types[ev.Data.CaptureID] = append(g.types[ev.Data.CaptureID], ev.Type)
	g.inFlight++
	g.peak = max(g.peak, g.inFlight)
	if g.inFlight == g.width {
		close(g.all)
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inFlight--
		g.mu.Unlock()
	}()
	select {
	case <-g.all:
		w.WriteHeader(http.StatusOK)
	case <-r.Context().Done():
	}
}

// TestWebhooksAreSentConcurrently: eight captures' webhooks go four at a
// time (the receiver answers none until four are in flight, and never sees
// a fifth at once), each capture's in order, each signed, over connections
// the provider's own client keeps alive; all sixteen are delivered once.
func TestWebhooksAreSentConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const senders, captures = 4, 16
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			g, url := newGatherer(t, senders)
			cfg := provider.Config{Records: b.open(t), APIKey: apiKey, Secret: secret, WebhookURL: url, Logger: slog.New(slog.DiscardHandler),
				WebhookWorkers: senders, WebhookBackoff: time.Millisecond, WebhookPoll: 10 * time.Millisecond,
				Signals: provider.Signals{Counted: testsignal.New()}}
			p, err := provider.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			e := serve(t, p)
			e.cfg = cfg
			var caps []provider.Capture
			for i := range captures {
				c, err := e.client.Capture(ctx, fmt.Sprintf("k%d", i), captureReq("acme", fmt.Sprintf("ch_%d", i), 100), "")
				if err != nil {
					t.Fatal(err)
				}
				caps = append(caps, c.Capture)
			}
			run(t, p) // every capture's webhooks are due before the first is claimed
			eventuallyStats(t, e, "every webhook delivered", func(s provider.Stats) bool {
				return s.WebhooksDelivered == 2*captures && s.WebhooksQueued == 0
			})

			g.mu.Lock()
			defer g.mu.Unlock()
			if g.peak != senders || len(g.bad) > 0 {
				t.Fatalf("%d webhooks in flight at most (want %d); not verified: %v", g.peak, senders, g.bad)
			}
			for _, c := range caps {
				if want := []string{provider.EventCaptureProcessing, provider.EventCaptureSucceeded}; !slices.Equal(g.types[c.ID], want) {
					t.Fatalf("capture %s: webhooks %v, want %v once each, in order", c.ID, g.types[c.ID], want)
				}
			}
			if c := p.Counters(); c.WebhooksSent != 2*captures || c.WebhooksRejected != 0 {
				t.Fatalf("counters %+v", c)
			}
			// A connection per sender, reused: the standard transport keeps
			// two per host alive and would dial again for most webhooks. A
			// connection dialled while another was being handed back may add
			// a few.
			if n := g.conns.Load(); n > senders+2 {
				t.Fatalf("%d connections for %d webhooks from %d senders", n, 2*captures, senders)
			}
		})
	}
}

// TestASlowWebhookHoldsOneSender: while the lab keeps one webhook waiting,
// the other sender delivers every other capture's webhooks, those claimed
// with it included; then the slow one is answered and its capture's next
// webhook follows it.
func TestASlowWebhookHoldsOneSender(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const captures = 6
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			var (
				held    atomic.Bool
				slow    = make(chan string, 1) // the held webhook's capture
				release = make(chan struct{})
				mu      sync.Mutex
				types   = map[string][]string{}
			)
			recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var ev provider.WebhookEvent
				if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
					w.WriteHeader(http.StatusBadRequest)
					return
				}
				mu.Lock()
				types[ev.Data.CaptureID] = append(types[ev.Data.CaptureID], ev.Type)
				mu.Unlock()
				if held.CompareAndSwap(false, true) {
					slow <- ev.Data.CaptureID
					select {
					case <-release:
					case <-r.Context().Done():
						return
					}
				}
				w.WriteHeader(http.StatusOK)
			}))
			t.Cleanup(recv.Close)
			cfg := provider.Config{Records: b.open(t), APIKey: apiKey, Secret: secret, WebhookURL: recv.URL, Logger: slog.New(slog.DiscardHandler),
				WebhookWorkers: 2, WebhookBackoff: time.Millisecond, WebhookPoll: 10 * time.Millisecond,
				Signals: provider.Signals{Counted: testsignal.New()}}
			p, err := provider.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			e := serve(t, p)
			e.cfg = cfg
			for i := range captures {
				if _, err := e.client.Capture(ctx, fmt.Sprintf("k%d", i), captureReq("acme", fmt.Sprintf("ch_%d", i), 100), ""); err != nil {
					t.Fatal(err)
				}
			}
			run(t, p)
			eventuallyStats(t, e, "every other capture's webhooks delivered", func(s provider.Stats) bool {
				return s.WebhooksDelivered == 2*(captures-1)
			})
			close(release)
			eventuallyStats(t, e, "the slow webhook and the one after it delivered", func(s provider.Stats) bool {
				return s.WebhooksDelivered == 2*captures && s.WebhooksQueued == 0
			})
			id := <-slow
			mu.Lock()
			defer mu.Unlock()
			if want := []string{provider.EventCaptureProcessing, provider.EventCaptureSucceeded}; !slices.Equal(types[id], want) {
				t.Fatalf("the slow capture's webhooks: %v, want %v", types[id], want)
			}
		})
	}
}

// TestStoppingReleasesEverySend: stopped while four senders each hold a
// webhook the receiver never answers, Run returns, and every one of them
// is back in the records, due now, for the next provider on them.
func TestStoppingReleasesEverySend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const senders = 4
	entered := make(chan struct{}, senders)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		entered <- struct{}{}
		<-r.Context().Done()
	}))
	t.Cleanup(recv.Close)
	records := provider.NewMemory()
	p, err := provider.New(provider.Config{Records: records, APIKey: apiKey, Secret: secret, WebhookURL: recv.URL,
		Logger: slog.New(slog.DiscardHandler), WebhookWorkers: senders})
	if err != nil {
		t.Fatal(err)
	}
	stop := running(t, ctx, p)
	e := serve(t, p)
	for i := range senders {
		if _, err := e.client.Capture(ctx, fmt.Sprintf("k%d", i), captureReq("acme", fmt.Sprintf("ch_%d", i), 100), ""); err != nil {
			t.Fatal(err)
		}
	}
	for range senders {
		testsignal.Receive(t, "every sender sending", entered)
	}
	stop()
	if c := p.Counters(); c.WebhooksFailed != 0 || c.WebhooksSent != 0 {
		t.Fatalf("counters %+v; want nothing given up", c)
	}
	claimed, err := records.ClaimWebhooks(ctx, time.Now(), 10, time.Minute)
	if err != nil || len(claimed) != senders {
		t.Fatalf("claimable after the stop: %d (%v), want the %d interrupted webhooks", len(claimed), err, senders)
	}
	for _, w := range claimed {
		if w.Type != provider.EventCaptureProcessing || w.Attempts != 2 {
			t.Fatalf("claimable after the stop: %+v; want an interrupted processing webhook", w)
		}
	}
}
