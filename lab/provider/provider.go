// Package provider is a simulated payment provider, over real HTTP: it
// captures charges (deduplicated by Idempotency-Key), sends receipts
// (deduplicated by event id) and calls the lab back with signed webhooks.
// Faults make it slow, failing, silent, or lose the answer to a capture it
// applied. Its records are the ground truth the lab compares its ledger
// with.
package provider

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	randv2 "math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab"
)

// Config says how a provider behaves. Zero fields take DefaultConfig's
// values, except Records and APIKey, which are required, and Secret,
// which is required when WebhookURL is set.
type Config struct {
	// Records keeps what the provider received.
	Records Records
	// APIKey is what every caller of the provider's routes sends as
	// Authorization: Bearer <APIKey>, as a real provider's API key: only
	// the lab (and whoever runs it) holds it. /health alone is open.
	APIKey string
	// Secret signs the webhooks.
	Secret []byte
	// WebhookURL receives the webhooks; empty sends none.
	WebhookURL string
	// Clock stamps records and webhooks. Default time.Now.
	Clock func() time.Time
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// HTTPClient sends the webhooks. Default: a client with a 10s timeout
	// that follows no redirect.
	HTTPClient *http.Client
	// Rand draws in [0, 1) for error_rate, applied_response_lost and the
	// webhook backoff's jitter, from concurrent requests. Default
	// math/rand/v2's Float64.
	Rand func() float64
	// WebhookAttempts is how many times one webhook is sent at most. Default 5.
	WebhookAttempts int
	// WebhookBackoff is the wait before the second attempt; it doubles
	// with each attempt, up to a minute, with jitter. Default 200ms.
	WebhookBackoff time.Duration
	// WebhookQueue bounds the webhooks waiting to be sent; when it is full
	// new ones are dropped. Default 4096.
	WebhookQueue int
	// WebhookWorkers send webhooks concurrently. Default 4.
	WebhookWorkers int
	// ResponseLostHold is how long a withheld answer is held at most
	// before the connection is closed, when the client waits longer.
	// Default 10s.
	ResponseLostHold time.Duration
}

// DefaultConfig returns the defaults; Records and APIKey (and Secret with
// a WebhookURL) remain to be set.
func DefaultConfig() Config {
	return Config{
		Clock:  time.Now,
		Logger: slog.Default(),
		HTTPClient: &http.Client{
			Timeout: 10 * time.Second,
			// A webhook goes where it was configured to, not where an answer points.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		Rand:             randv2.Float64,
		WebhookAttempts:  5,
		WebhookBackoff:   200 * time.Millisecond,
		WebhookQueue:     4096,
		WebhookWorkers:   4,
		ResponseLostHold: 10 * time.Second,
	}
}

// Provider is the simulated payment provider.
type Provider struct {
	cfg    Config
	forged []byte // the wrong secret of webhook_bad_signature copies

	mu     sync.Mutex
	faults map[lab.Namespace]Faults // standing faults

	flightMu sync.Mutex
	inFlight map[string]int // requests being handled, per capture key or receipt event id

	queueMu sync.Mutex
	closed  bool                // no more webhooks are queued: Run has stopped its workers
	waiting map[*time.Timer]int // jobs waiting out a backoff, and how many webhooks each holds
	queue   chan webhookJob
	running atomic.Bool
	stopped chan struct{} // closed when Run returns: held answers are let go

	counters counters
}

// Counters are what this process's provider did, whatever the namespace.
type Counters struct {
	// InFlightOverlaps counts requests that arrived while another with the
	// same capture key or receipt event id was being handled.
	InFlightOverlaps int64 `json:"in_flight_overlaps"`
	// ErrorsInjected counts 503s of error_rate.
	ErrorsInjected int64 `json:"errors_injected"`
	// ResponsesLost counts applied requests whose answer was withheld.
	ResponsesLost int64 `json:"responses_lost"`
	// ConnectionsDropped counts connections closed without an answer
	// (down, and every lost response).
	ConnectionsDropped int64 `json:"connections_dropped"`
	// WebhooksSent counts webhooks the receiver accepted (2xx).
	WebhooksSent int64 `json:"webhooks_sent"`
	// WebhooksFailed counts webhooks given up: attempts exhausted or an
	// answer not worth retrying.
	WebhooksFailed int64 `json:"webhooks_failed"`
	// WebhooksRejected counts answers outside 2xx, one per attempt.
	WebhooksRejected int64 `json:"webhooks_rejected"`
	// WebhooksDropped counts webhooks never sent: the queue was full, or
	// the provider stopped first.
	WebhooksDropped int64 `json:"webhooks_dropped"`
	// WebhooksQueued counts the jobs (a capture's webhooks, in order)
	// waiting to be sent or waiting out a backoff, now.
	WebhooksQueued int64 `json:"webhooks_queued"`
}

type counters struct {
	overlaps, errorsInjected, responsesLost, dropped                atomic.Int64
	webhooksSent, webhooksFailed, webhooksRejected, webhooksDropped atomic.Int64
}

// Counters reads the counters.
func (p *Provider) Counters() Counters {
	c := &p.counters
	p.queueMu.Lock()
	queued := int64(len(p.queue) + len(p.waiting))
	p.queueMu.Unlock()
	return Counters{
		WebhooksQueued:   queued,
		InFlightOverlaps: c.overlaps.Load(), ErrorsInjected: c.errorsInjected.Load(),
		ResponsesLost: c.responsesLost.Load(), ConnectionsDropped: c.dropped.Load(),
		WebhooksSent: c.webhooksSent.Load(), WebhooksFailed: c.webhooksFailed.Load(),
		WebhooksRejected: c.webhooksRejected.Load(), WebhooksDropped: c.webhooksDropped.Load(),
	}
}

// New returns a provider on cfg.
func New(cfg Config) (*Provider, error) {
	d := DefaultConfig()
	if cfg.Records == nil {
		return nil, errors.New("provider: Records is required")
	}
	if err := CheckAPIKey(cfg.APIKey); err != nil {
		return nil, fmt.Errorf("provider: %w", err)
	}
	if cfg.WebhookURL != "" {
		u, err := url.Parse(cfg.WebhookURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("provider: WebhookURL must be an absolute http(s) URL (got %q)", cfg.WebhookURL)
		}
		if len(cfg.Secret) == 0 {
			return nil, errors.New("provider: a Secret is required to sign webhooks")
		}
	}
	for _, v := range []struct {
		name string
		bad  bool
	}{
		{"WebhookAttempts", cfg.WebhookAttempts < 0},
		{"WebhookBackoff", cfg.WebhookBackoff < 0},
		{"WebhookQueue", cfg.WebhookQueue < 0},
		{"WebhookWorkers", cfg.WebhookWorkers < 0},
		{"ResponseLostHold", cfg.ResponseLostHold < 0},
	} {
		if v.bad {
			return nil, fmt.Errorf("provider: %s must not be negative", v.name)
		}
	}
	if cfg.Clock == nil {
		cfg.Clock = d.Clock
	}
	if cfg.Logger == nil {
		cfg.Logger = d.Logger
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = d.HTTPClient
	}
	if cfg.Rand == nil {
		cfg.Rand = d.Rand
	}
	if cfg.WebhookAttempts == 0 {
		cfg.WebhookAttempts = d.WebhookAttempts
	}
	if cfg.WebhookBackoff == 0 {
		cfg.WebhookBackoff = d.WebhookBackoff
	}
	if cfg.WebhookQueue == 0 {
		cfg.WebhookQueue = d.WebhookQueue
	}
	if cfg.WebhookWorkers == 0 {
		cfg.WebhookWorkers = d.WebhookWorkers
	}
	if cfg.ResponseLostHold == 0 {
		cfg.ResponseLostHold = d.ResponseLostHold
	}
	forged := make([]byte, 32)
	rand.Read(forged) // never fails (crypto/rand)
	return &Provider{
		cfg: cfg, forged: forged,
		faults: map[lab.Namespace]Faults{}, inFlight: map[string]int{},
		queue: make(chan webhookJob, cfg.WebhookQueue), stopped: make(chan struct{}), waiting: map[*time.Timer]int{},
	}, nil
}

// CheckAPIKey accepts an API key: 1..255 printable ASCII characters, no
// space, as a bearer token is sent.
func CheckAPIKey(key string) error {
	if !printable(key, true) || strings.ContainsRune(key, ' ') {
		return errors.New("an API key is required: 1..255 printable ASCII characters without spaces, " +
			"which every caller of the provider's routes sends as Authorization: Bearer <key>")
	}
	return nil
}

// Register mounts the provider's routes on g, which the caller names, e.g.
// e.Group("/provider"); the routes below are relative to it. Every one but
// /health asks for the API key (Authorization: Bearer <key>); without it,
// or with another, the answer is 401 and nothing is read or changed:
//
//	POST   /captures              capture a charge (Idempotency-Key required)
//	POST   /receipts              send a receipt (deduplicated by event_id)
//	GET    /captures              list captures (?namespace=&run=&charge_id=&limit=)
//	GET    /stats                 sum the records (?namespace=&run=&charge_id=) and the counters
//	DELETE /namespaces/:ns        forget a namespace's records
//	DELETE /records               forget every record
//	PUT    /faults/:ns            set a namespace's standing faults
//	GET    /faults/:ns            read them
//	DELETE /faults/:ns            clear them
//	GET    /health                200 while the process runs
func (p *Provider) Register(g *echo.Group) {
	g.POST("/captures", p.capture, p.authenticate)
	g.POST("/receipts", p.receipt, p.authenticate)
	g.GET("/captures", p.listCaptures, p.authenticate)
	g.GET("/stats", p.stats, p.authenticate)
	g.DELETE("/namespaces/:ns", p.resetNamespace, p.authenticate)
	g.DELETE("/records", p.resetAll, p.authenticate)
	g.PUT("/faults/:ns", p.putFaults, p.authenticate)
	g.GET("/faults/:ns", p.getFaults, p.authenticate)
	g.DELETE("/faults/:ns", p.deleteFaults, p.authenticate)
	g.GET("/health", p.health) // a liveness probe: it reads and changes nothing
}

// Run sends webhooks until ctx ends and returns once its workers stopped.
// Webhooks still queued then are dropped (and counted); answers being
// withheld are let go. Call it once: a second call returns at once.
func (p *Provider) Run(ctx context.Context) {
	if !p.running.CompareAndSwap(false, true) {
		p.cfg.Logger.ErrorContext(ctx, "provider: Run called twice; the second call does nothing")
		return
	}
	defer close(p.stopped)
	var wg sync.WaitGroup
	for range p.cfg.WebhookWorkers {
		wg.Go(func() { p.sendWebhooks(ctx) })
	}
	wg.Wait()
	dropped := 0
	p.queueMu.Lock()
	p.closed = true
	for t, n := range p.waiting {
		if t.Stop() { // never to fire: its webhooks will not be sent
			dropped += n
		}
		delete(p.waiting, t)
	}
	p.queueMu.Unlock()
drain:
	for {
		select {
		case j := <-p.queue:
			dropped += len(j.sends)
		default:
			break drain
		}
	}
	if dropped > 0 {
		p.counters.webhooksDropped.Add(int64(dropped))
		p.cfg.Logger.InfoContext(context.WithoutCancel(ctx), "provider stopped: queued webhooks dropped", "webhooks", dropped)
	}
}

// standing returns a namespace's standing faults.
func (p *Provider) standing(ns lab.Namespace) Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults[ns]
}

// hit draws a fault of probability prob; the certain and the impossible
// draw nothing, so tests can rely on them whatever Rand does.
func (p *Provider) hit(prob float64) bool {
	return prob >= 1 || (prob > 0 && p.cfg.Rand() < prob)
}

// enter marks a request for id in flight and reports whether another was
// already; leave ends it.
func (p *Provider) enter(id string) (overlap bool) {
	p.flightMu.Lock()
	defer p.flightMu.Unlock()
	overlap = p.inFlight[id] > 0
	p.inFlight[id]++
	if overlap {
		p.counters.overlaps.Add(1)
	}
	return overlap
}

func (p *Provider) leave(id string) {
	p.flightMu.Lock()
	defer p.flightMu.Unlock()
	if p.inFlight[id]--; p.inFlight[id] <= 0 {
		delete(p.inFlight, id)
	}
}
