package app

import (
	"errors"
	"fmt"
	"github.com/idempotency-lab/lab/lab/httpserve"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/relay"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Config is the whole configuration of a lab. DefaultConfig fills in every
// default, in this one place; Start only validates. The command's flags and
// environment variables are derived from these fields (cmd/lab).
type Config struct {
	// Addr is the listen address. Default 127.0.0.1:8616.
	Addr string
	// BasePath prefixes every route when the lab sits behind a hub, e.g.
	// "/16". Default none.
	BasePath string
	// ReadTimeout bounds reading a whole request, headers and body, so a
	// client that sends a byte a second is closed. Default 10s.
	ReadTimeout time.Duration
	// WriteTimeout bounds a whole exchange, from the end of the headers to
	// the end of the answer; it must outlast the longest lab run. Default 5m.
	WriteTimeout time.Duration
	// IdleTimeout closes keep-alive connections left idle. Default 1m.
	IdleTimeout time.Duration
	// Tenants maps bearer tokens to tenants. Default the two demo tenants,
	// demo-token-acme → acme and demo-token-globex → globex.
	Tenants map[string]string
	// PublicTenant is the tenant (one of Tenants) a lab route's caller acts
	// as when they send no token: the shared, public namespace. Default acme.
	PublicTenant string
	// JoinCode, when set, is what POST /lab/join asks of an attendee for a
	// namespace of their own. Default none: anyone may join.
	JoinCode string
	// MaxAttendees bounds how many may join. Default 200.
	MaxAttendees int
	// MaxRuns bounds the lab runs, design checks and matrices in flight on a
	// replica, every namespace's together (each namespace may have 2);
	// over it a run is refused with 503 and Retry-After, so that the runs
	// under way stay fast. 0: no bound. Default 16: what the default PostgreSQL pool (20 per replica) serves without running out, measured under a workshop load (docs/configuration.md).
	MaxRuns int
	// AdminToken, when set, is the only way to reset or restart every
	// namespace at once (all=true) and to see every namespace; without it
	// anyone may, which Start allows on loopback only: listening beyond it,
	// Start draws one (App.AdminToken). Default none.
	AdminToken string
	// FaultsEnabled accepts the Lab-Fault header and fault= runs. Default on.
	FaultsEnabled bool
	// DefaultStore is the store of POST /charges without ?store= and of
	// /charge-idempotent. Default memory.
	DefaultStore lab.StoreName
	// Window is how long a completed key is kept (the dedupe window).
	// Default 24h.
	Window time.Duration
	// InFlightWait bounds the wait for an in-flight request with the same
	// key before 409. Default 2s.
	InFlightWait time.Duration
	// ClaimTTL is the lifetime of a lock-style claim (redis). Default 30s.
	ClaimTTL time.Duration
	// SweepInterval is how often expired keys are swept. Default 1m.
	SweepInterval time.Duration
	// MaxReplicas is how many in-process replicas a run may use, 1..8.
	// Default 8.
	MaxReplicas int
	// Peers are the base URLs of peer processes (cluster mode). Default none.
	Peers []string
	// Replica names this replica. Default r1.
	Replica string
	// DatabaseURL is the PostgreSQL holding the ledger, the outbox and the
	// postgres store. Default none (then the throwaway cluster, or memory).
	DatabaseURL string
	// PGSchema is the lab's own schema. Default idempotency_lab.
	PGSchema string
	// PGPoolSize is the connections per replica pool, 1..500. Default 20.
	PGPoolSize int
	// EmbedPostgres starts a throwaway cluster when DatabaseURL is unset and
	// the PostgreSQL server binaries are installed. Default on.
	EmbedPostgres bool
	// RedisURL is the Redis of the redis store. Default none (then the
	// embedded one).
	RedisURL string
	// RedisPrefix starts every Redis key the lab writes. Default
	// idempotency-lab:.
	RedisPrefix string
	// EmbedRedis starts an embedded Redis (miniredis) when RedisURL is
	// unset. Default on.
	EmbedRedis bool
	// RedisPair starts a Redis primary and an asynchronously replicating
	// replica (two throwaway redis-server processes, when installed) for
	// the failover fault. Default on.
	RedisPair bool
	// RedisPairPrimary and RedisPairReplica are the redis:// URLs of a
	// running primary and its replica to fail over instead of the
	// throwaway pair (compose's redis-pair services; in cluster mode every
	// process names the same two). Only failover runs use them. Default none.
	RedisPairPrimary string
	RedisPairReplica string
	// Variants are the designs the lab offers, in presentation order. The
	// command passes every built-in one (variants.Builtin).
	Variants []variant.Variant
	// Relay tunes the outbox relay: its workers, lease, batch, attempts and
	// backoff. Default relay.Defaults().
	Relay relay.Settings
	// ProviderURL is the payment provider the relay delivers captures and
	// receipts to, such as a `lab provider` process. Default none: the lab
	// runs its own provider on ProviderAddr.
	ProviderURL string
	// ProviderAddr is where the lab's own provider listens when ProviderURL
	// is unset. Default 127.0.0.1:0 (a free loopback port).
	ProviderAddr string
	// ProviderTimeout bounds one delivery to the provider (a capture, the
	// relay's or a direct send's): a response the provider withholds shows
	// as this timeout. The lab's reads of its provider wait as long as
	// their caller. Default 2s.
	ProviderTimeout time.Duration
	// WebhookSecret signs (the lab's own provider) and verifies (the lab)
	// the provider's webhooks. Default none: a random one per process,
	// which only works with the lab's own provider; with ProviderURL it is
	// required and must be the provider's.
	WebhookSecret string
	// WebhookWindow is how long the lab's own provider retries a webhook
	// the lab does not acknowledge (with backoff, across restarts when its
	// records are in PostgreSQL) before the webhook is dead. Default 10m:
	// the lab's scale; a real provider retries for days.
	WebhookWindow time.Duration
	// WebhookSenders bounds the webhooks the lab's own provider sends at
	// once (its pool of senders), each waiting on the lab's answer.
	// Default 16.
	WebhookSenders int
	// PruneAfter is how long what only settles a delivery is kept before
	// the pruner deletes it: delivered outbox events, the webhook event ids
	// the lab processed, and its own provider's receipts and delivered
	// webhooks. The ledger and the captures are never pruned, nor a
	// pending or dead event, and outbox_delivered counts the pruned events
	// from a roll-up. It must outlast WebhookWindow by the provider's
	// webhook lease, so that a webhook redelivered at the end of its window
	// still finds its event id and changes nothing. Default 24h.
	PruneAfter time.Duration
	// PruneInterval is how often the pruner runs. Default 1m.
	PruneInterval time.Duration
	// StuckAfter is how long after its capture a charge may stay pending
	// before /lab/reconcile calls it stuck (not settling: its webhook is
	// not coming) and /metrics counts it in the oldest stuck charge's age.
	// Default 2m.
	StuckAfter time.Duration
	// ProviderAPIKey is the provider's API key, which the lab sends with
	// every call (Authorization: Bearer) and without which the provider
	// answers 401. Default none: the lab's own provider draws one per
	// process, known to nobody else; with ProviderURL it is required and
	// must be the provider's.
	ProviderAPIKey string
	// Clock tells the time to every service. Default time.Now.
	Clock lab.Clock
	// Logger receives the lab's logs. Default: discarded.
	Logger *slog.Logger
}

// Timeouts are the ones every server of the lab takes (its replicas, its
// own provider), as configured.
func (c Config) Timeouts() httpserve.Timeouts {
	return httpserve.Timeouts{Read: c.ReadTimeout, Write: c.WriteTimeout, Idle: c.IdleTimeout}
}

// DefaultConfig returns the lab's defaults, with no variants.
func DefaultConfig() Config {
	return Config{
		Addr:            "127.0.0.1:8616",
		ReadTimeout:     httpserve.DefaultTimeouts().Read,
		WriteTimeout:    httpserve.DefaultTimeouts().Write,
		IdleTimeout:     httpserve.DefaultTimeouts().Idle,
		Tenants:         map[string]string{"demo-token-acme": "acme", "demo-token-globex": "globex"},
		FaultsEnabled:   true,
		PublicTenant:    "acme",
		MaxAttendees:    200,
		MaxRuns:         16,
		DefaultStore:    "memory",
		Window:          24 * time.Hour,
		InFlightWait:    2 * time.Second,
		ClaimTTL:        30 * time.Second,
		SweepInterval:   time.Minute,
		MaxReplicas:     8,
		Replica:         "r1",
		PGSchema:        "idempotency_lab",
		PGPoolSize:      20,
		EmbedPostgres:   true,
		RedisPrefix:     "idempotency-lab:",
		EmbedRedis:      true,
		RedisPair:       true,
		Relay:           relay.Defaults().Settings,
		ProviderAddr:    "127.0.0.1:0",
		ProviderTimeout: 2 * time.Second,
		WebhookWindow:   10 * time.Minute,
		WebhookSenders:  16,
		PruneAfter:      24 * time.Hour,
		PruneInterval:   time.Minute,
		StuckAfter:      2 * time.Minute,
		Clock:           time.Now,
		Logger:          slog.New(slog.DiscardHandler),
	}
}

// ownWebhookLease is how long the lab's own provider hides a webhook it is
// sending: a claim made at the end of the window may send it once more
// that much later.
func ownWebhookLease() time.Duration { return provider.DefaultConfig().WebhookLease }

var replicaName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,32}$`)

// Validate reports every setting that is out of range.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Addr == "" {
		bad("addr is required (e.g. 127.0.0.1:8616)")
	}
	if c.BasePath != "" && (!strings.HasPrefix(c.BasePath, "/") || strings.ContainsAny(c.BasePath, "?#")) {
		bad("base path must start with / and hold no ? or # (got %q)", c.BasePath)
	}
	if len(c.Tenants) == 0 {
		bad("at least one tenant is required")
	}
	public := false
	for token, tenant := range c.Tenants {
		if err := lab.CheckNamespace(tenant); err != nil {
			bad("tenant %q: %v", tenant, err)
		}
		if token == "" || lab.ValidateKey(token) != nil || strings.ContainsRune(token, ' ') {
			bad("the token of tenant %q must be printable text without spaces", tenant)
		}
		if token == c.AdminToken {
			bad("the admin token must not also be a tenant's token")
		}
		public = public || tenant == c.PublicTenant
	}
	if !public {
		bad("public tenant %q is not one of the configured tenants", c.PublicTenant)
	}
	if c.MaxAttendees < 0 {
		bad("max attendees must not be negative (got %d)", c.MaxAttendees)
	}
	if c.MaxRuns < 0 {
		bad("max runs must not be negative (got %d)", c.MaxRuns)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"dedupe window", c.Window}, {"in-flight wait", c.InFlightWait}, {"claim TTL", c.ClaimTTL}, {"sweep interval", c.SweepInterval},
		{"read timeout", c.ReadTimeout}, {"write timeout", c.WriteTimeout}, {"idle timeout", c.IdleTimeout},
		{"webhook window", c.WebhookWindow}, {"stuck bound", c.StuckAfter},
		{"prune retention", c.PruneAfter}, {"prune interval", c.PruneInterval}} {
		if d.v <= 0 {
			bad("%s must be a positive duration (got %s)", d.name, d.v)
		}
	}
	// The lab must remember a webhook's event id as long as the provider
	// may send it again: its window, and the lease of the last attempt.
	if least := c.WebhookWindow + ownWebhookLease(); c.PruneAfter > 0 && c.PruneAfter < least {
		bad("-prune-after (LAB_PRUNE_AFTER) is %s, shorter than the provider's webhook redelivery window (-webhook-window %s) "+
			"and its webhook lease (%s): a webhook redelivered then would no longer be known and would be processed again; "+
			"set -prune-after to at least %s", c.PruneAfter, c.WebhookWindow, ownWebhookLease(), least)
	}
	if c.MaxReplicas < 1 || c.MaxReplicas > 8 {
		bad("max replicas must be in 1..8 (got %d)", c.MaxReplicas)
	}
	if c.PGPoolSize < 1 || c.PGPoolSize > 500 {
		bad("pg pool size must be in 1..500 (got %d)", c.PGPoolSize)
	}
	if err := pgdb.CheckSchema(c.PGSchema); err != nil {
		errs = append(errs, err)
	}
	if c.RedisPrefix == "" {
		bad("redis prefix is required: the lab only touches keys under it")
	}
	if !replicaName.MatchString(c.Replica) {
		bad("replica name must be 1..32 letters, digits, '.', '_' or '-' (got %q)", c.Replica)
	}
	for _, p := range c.Peers {
		if u, err := url.Parse(p); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("peer %q must be an http(s) base URL", p)
		}
	}
	if len(c.Peers) > 0 && c.DatabaseURL == "" {
		bad("cluster mode (peers) needs a shared ledger: set DATABASE_URL to the PostgreSQL every replica uses; " +
			"an embedded or in-memory ledger would give each process its own ground truth")
	}
	if len(c.Variants) == 0 {
		bad("no variants: the lab needs at least one design to offer")
	}
	if c.ProviderURL != "" {
		if u, err := url.Parse(c.ProviderURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("provider URL %q must be an http(s) base URL", c.ProviderURL)
		}
		if c.WebhookSecret == "" {
			bad("an external provider (provider URL) signs its webhooks with a shared secret: set the webhook secret to the provider's")
		}
		if c.ProviderAPIKey == "" {
			bad("an external provider (provider URL) authenticates its callers: set the provider API key to the provider's")
		}
	} else if c.ProviderAddr == "" {
		bad("provider addr is required when no provider URL is given (e.g. 127.0.0.1:0)")
	}
	if c.ProviderAPIKey != "" {
		if err := provider.CheckAPIKey(c.ProviderAPIKey); err != nil {
			bad("provider API key: %v", err)
		}
	}
	if (c.RedisPairPrimary == "") != (c.RedisPairReplica == "") {
		bad("the Redis pair needs both its primary and its replica URL (or neither)")
	}
	if c.WebhookSenders < 1 || c.WebhookSenders > 256 {
		bad("webhook senders must be in 1..256 (got %d)", c.WebhookSenders)
	}
	if c.ProviderTimeout <= 0 {
		bad("provider timeout must be a positive duration (got %s)", c.ProviderTimeout)
	}
	if c.Clock == nil || c.Logger == nil {
		bad("clock and logger are required")
	}
	if err := c.Relay.Validate(); err != nil {
		errs = append(errs, err)
	}
	known := false
	for _, v := range c.Variants {
		known = known || v.Name == c.DefaultStore
	}
	if len(c.Variants) > 0 && !known {
		bad("default store %q is not a registered variant", c.DefaultStore)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	return nil
}
