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
	"github.com/idempotency-lab/lab/lab/testsignal"
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
	// HTTPClient sends the webhooks. Default: a client of the provider's
	// own with a 10s timeout that follows no redirect and keeps a
	// connection alive per sender (WebhookWorkers), closed when Run ends.
	HTTPClient *http.Client
	// Rand draws in [0, 1) for error_rate, applied_response_lost and the
	// webhook backoff's jitter, from concurrent requests. Default
	// math/rand/v2's Float64.
	Rand func() float64
	// WebhookWindow is how long a webhook is retried from when it is
	// due: a failed attempt whose next one would fall after it makes the
	// webhook dead. Default 10m, the lab's scale: a real provider retries
	// for days.
	WebhookWindow time.Duration
	// WebhookAttempts caps the attempts of one webhook within its window.
	// Default 0: no cap, the window alone ends the retries.
	WebhookAttempts int
	// WebhookBackoff is the wait before the second attempt; it doubles
	// with each attempt, up to a minute, with jitter. Default 200ms.
	WebhookBackoff time.Duration
	// WebhookWorkers bounds the webhooks sent at once: a pool of that many
	// senders, fed by one loop that claims as many due webhooks as senders
	// are free. Each send waits on the lab's answer (a transaction there),
	// so one at a time would let webhooks fall behind the captures. Default 16.
	WebhookWorkers int
	// WebhookLease hides a claimed webhook from other workers while one
	// sends it: a worker that dies mid-send leaves it to be sent again
	// after the lease. Default 1m.
	WebhookLease time.Duration
	// WebhookPoll is how often an idle worker looks for due webhooks that
	// this provider did not just write (another process's, a backoff run
	// out, a previous run's). Default 250ms.
	WebhookPoll time.Duration
	// ResponseLostHold is how long a withheld answer is held at most
	// before the connection is closed, when the client waits longer.
	// Default 10s.
	ResponseLostHold time.Duration
	// Signals are what a test waits on; the zero value signals nothing.
	Signals Signals
}

// Signals are the points of a provider a test can wait on, instead of
// sleeping (see lab/testsignal).
type Signals struct {
	// Counted: the counters moved (a connection dropped, an answer
	// withheld), or a webhook attempt's outcome is recorded.
	Counted testsignal.Signal
}

// DefaultConfig returns the defaults; Records and APIKey (and Secret with
// a WebhookURL) remain to be set.
func DefaultConfig() Config {
	return Config{
		Clock:            time.Now,
		Logger:           slog.Default(),
		Rand:             randv2.Float64,
		WebhookWindow:    10 * time.Minute,
		WebhookBackoff:   200 * time.Millisecond,
		WebhookWorkers:   16,
		WebhookLease:     time.Minute,
		WebhookPoll:      250 * time.Millisecond,
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

	wake    chan struct{} // a capture wrote webhooks: the claim loop looks now
	ownHTTP bool          // HTTPClient is the provider's own: its idle connections close with Run
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
	// WebhooksFailed counts webhooks this process gave up (made dead): an
	// answer not worth retrying, its window over, or its attempts spent.
	WebhooksFailed int64 `json:"webhooks_failed"`
	// WebhooksRejected counts answers outside 2xx, one per attempt.
	WebhooksRejected int64 `json:"webhooks_rejected"`
}

type counters struct {
	overlaps, errorsInjected, responsesLost, dropped atomic.Int64
	webhooksSent, webhooksFailed, webhooksRejected   atomic.Int64
}

// Counters reads the counters.
func (p *Provider) Counters() Counters {
	c := &p.counters
	return Counters{
		InFlightOverlaps: c.overlaps.Load(), ErrorsInjected: c.errorsInjected.Load(),
		ResponsesLost: c.responsesLost.Load(), ConnectionsDropped: c.dropped.Load(),
		WebhooksSent: c.webhooksSent.Load(), WebhooksFailed: c.webhooksFailed.Load(), WebhooksRejected: c.webhooksRejected.Load(),
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
		{"WebhookWindow", cfg.WebhookWindow < 0},
		{"WebhookAttempts", cfg.WebhookAttempts < 0},
		{"WebhookBackoff", cfg.WebhookBackoff < 0},
		{"WebhookWorkers", cfg.WebhookWorkers < 0},
		{"WebhookLease", cfg.WebhookLease < 0},
		{"WebhookPoll", cfg.WebhookPoll < 0},
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
	if cfg.Rand == nil {
		cfg.Rand = d.Rand
	}
	if cfg.WebhookWindow == 0 {
		cfg.WebhookWindow = d.WebhookWindow
	}
	if cfg.WebhookBackoff == 0 {
		cfg.WebhookBackoff = d.WebhookBackoff
	}
	if cfg.WebhookWorkers == 0 {
		cfg.WebhookWorkers = d.WebhookWorkers
	}
	if cfg.WebhookLease == 0 {
		cfg.WebhookLease = d.WebhookLease
	}
	if cfg.WebhookPoll == 0 {
		cfg.WebhookPoll = d.WebhookPoll
	}
	if cfg.ResponseLostHold == 0 {
		cfg.ResponseLostHold = d.ResponseLostHold
	}
	own := cfg.HTTPClient == nil
	if own {
		cfg.HTTPClient = &http.Client{
			Timeout:   10 * time.Second,
			Transport: NewTransport(cfg.WebhookWorkers),
			// A webhook goes where it was configured to, not where an answer points.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	forged := make([]byte, 32)
	rand.Read(forged) // never fails (crypto/rand)
	return &Provider{
		cfg: cfg, forged: forged, ownHTTP: own,
		faults: map[lab.Namespace]Faults{}, inFlight: map[string]int{},
		wake: make(chan struct{}, 1), stopped: make(chan struct{}),
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

// Run sends the records' webhooks until ctx ends and returns once its
// senders stopped (none without a WebhookURL). What is not delivered stays
// in the records, for the next Run on them (this process's or another's);
// a webhook being sent is released at once, and answers being withheld
// are let go. Call it once: a second call returns at once.
func (p *Provider) Run(ctx context.Context) {
	if !p.running.CompareAndSwap(false, true) {
		p.cfg.Logger.ErrorContext(ctx, "provider: Run called twice; the second call does nothing")
		return
	}
	defer close(p.stopped)
	if p.cfg.WebhookURL == "" {
		<-ctx.Done()
		return
	}
	if p.ownHTTP {
		defer p.cfg.HTTPClient.CloseIdleConnections() // their goroutines end with Run
	}
	p.sendWebhooks(ctx)
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
