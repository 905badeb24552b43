package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
)

// setting binds one app.Config field to a flag and an environment variable.
// The flag's default is the field's value in app.DefaultConfig.
type setting struct {
	flag  string
	env   string
	usage string
	value flag.Value
}

// settings lists every configurable field of c, in the order --help shows them.
func settings(c *app.Config, logLevel *string) []setting {
	return []setting{
		{"addr", "LAB_ADDR", "listen address", (*text)(&c.Addr)},
		{"read-timeout", "LAB_READ_TIMEOUT", "bound on reading a whole request (slow clients are closed)", (*duration)(&c.ReadTimeout)},
		{"write-timeout", "LAB_WRITE_TIMEOUT", "bound on a whole exchange; must outlast the longest run", (*duration)(&c.WriteTimeout)},
		{"idle-timeout", "LAB_IDLE_TIMEOUT", "idle keep-alive connections are closed after this", (*duration)(&c.IdleTimeout)},
		{"base-path", "LAB_BASE_PATH", "route prefix when behind a hub, e.g. /16", (*text)(&c.BasePath)},
		{"tenants", "LAB_TENANTS", "bearer tokens and their tenants, token:tenant,...", (*tenants)(&c.Tenants)},
		{"public-tenant", "LAB_PUBLIC_TENANT", "the tenant whose namespace lab routes act in when the caller sends no token", (*text)(&c.PublicTenant)},
		{"join-code", "LAB_JOIN_CODE", "code POST /lab/join asks of attendees; empty lets anyone join", (*text)(&c.JoinCode)},
		{"max-attendees", "LAB_MAX_ATTENDEES", "how many attendees may join", (*integer)(&c.MaxAttendees)},
		{"max-runs", "LAB_MAX_RUNS", "lab runs, design checks and matrices in flight on a replica, every namespace's together (2 each); over it, 503 with Retry-After; 0: no bound", (*integer)(&c.MaxRuns)},
		{"admin-token", "LAB_ADMIN_TOKEN", "token (as Authorization: Bearer) to reset, restart and see every namespace; empty lets anyone on loopback, and beyond it the lab draws one and prints it", (*text)(&c.AdminToken)},
		{"faults", "LAB_FAULTS", "fault injection, on or off", (*onOff)(&c.FaultsEnabled)},
		{"default-store", "LAB_DEFAULT_STORE", "store of POST /charges without ?store= and of /charge-idempotent", (*storeName)(&c.DefaultStore)},
		{"dedupe-window", "LAB_DEDUPE_WINDOW", "how long a completed key is kept", (*duration)(&c.Window)},
		{"inflight-wait", "LAB_INFLIGHT_WAIT", "bounded wait for an in-flight request with the same key before 409", (*duration)(&c.InFlightWait)},
		{"claim-ttl", "LAB_CLAIM_TTL", "lifetime of a redis claim", (*duration)(&c.ClaimTTL)},
		{"sweep-interval", "LAB_SWEEP_INTERVAL", "how often expired keys are swept", (*duration)(&c.SweepInterval)},
		{"relay-workers", "LAB_RELAY_WORKERS", "outbox relay workers per process, each claiming its own batch; the least there are", (*integer)(&c.Relay.Workers)},
		{"relay-max-workers", "LAB_RELAY_MAX_WORKERS", "the most outbox relay workers per process: full claims add workers up to it, idle ones stop", (*integer)(&c.Relay.MaxWorkers)},
		{"relay-concurrency", "LAB_RELAY_CONCURRENCY", "deliveries of one worker in flight at once", (*integer)(&c.Relay.Concurrency)},
		{"relay-max-attempts", "LAB_RELAY_MAX_ATTEMPTS", "delivery attempts before an outbox event is dead", (*integer)(&c.Relay.MaxAttempts)},
		{"relay-base-backoff", "LAB_RELAY_BASE_BACKOFF", "first retry delay of a failed delivery, doubled per attempt, with jitter", (*duration)(&c.Relay.BaseBackoff)},
		{"relay-max-backoff", "LAB_RELAY_MAX_BACKOFF", "cap of the retry delay of a failed delivery", (*duration)(&c.Relay.MaxBackoff)},
		{"provider-url", "LAB_PROVIDER_URL", "payment provider the relay delivers to (a `lab provider`); empty runs one in this process", (*text)(&c.ProviderURL)},
		{"provider-addr", "LAB_PROVIDER_ADDR", "where this process's own provider listens when -provider-url is empty", (*text)(&c.ProviderAddr)},
		{"provider-timeout", "LAB_PROVIDER_TIMEOUT", "bound on one delivery to the provider (a capture); a withheld answer shows as this timeout", (*duration)(&c.ProviderTimeout)},
		{"webhook-secret", "LAB_WEBHOOK_SECRET", "secret of the provider's webhook signatures; empty draws one (only with the lab's own provider)", (*text)(&c.WebhookSecret)},
		{"webhook-window", "LAB_WEBHOOK_WINDOW", "how long this process's own provider retries an unacknowledged webhook before it is dead", (*duration)(&c.WebhookWindow)},
		{"webhook-senders", "LAB_WEBHOOK_SENDERS", "webhooks this process's own provider sends at once, 1..256", (*integer)(&c.WebhookSenders)},
		{"prune-after", "LAB_PRUNE_AFTER", "delivered outbox events, processed webhook ids and the own provider's receipts and delivered webhooks are pruned once this old (never the ledger or the captures); at least -webhook-window plus the provider's 1m lease", (*duration)(&c.PruneAfter)},
		{"prune-interval", "LAB_PRUNE_INTERVAL", "how often the pruner deletes what outlived -prune-after, in batches of 1,000", (*duration)(&c.PruneInterval)},
		{"stuck-after", "LAB_STUCK_AFTER", "a captured charge still pending this long after is stuck (reconcile, /metrics)", (*duration)(&c.StuckAfter)},
		{"provider-api-key", "LAB_PROVIDER_API_KEY", "API key the provider asks of every call (Authorization: Bearer); empty draws one (only with the lab's own provider)", (*text)(&c.ProviderAPIKey)},
		{"max-replicas", "LAB_MAX_REPLICAS", "in-process replicas a run may use, 1..8", (*integer)(&c.MaxReplicas)},
		{"peers", "LAB_PEERS", "base URLs of peer lab processes, comma-separated (cluster mode)", (*list)(&c.Peers)},
		{"replica", "LAB_REPLICA", "name of this replica", (*text)(&c.Replica)},
		{"database-url", "DATABASE_URL", "PostgreSQL URL; holds the ledger, the outbox and the postgres store", (*text)(&c.DatabaseURL)},
		{"pg-schema", "LAB_PG_SCHEMA", "the lab's own PostgreSQL schema", (*text)(&c.PGSchema)},
		{"pg-pool-size", "LAB_PG_POOL_SIZE", "PostgreSQL connections per replica, 1..500", (*integer)(&c.PGPoolSize)},
		{"embedded-postgres", "LAB_EMBEDDED_POSTGRES", "without DATABASE_URL, start a throwaway PostgreSQL cluster when the server binaries are installed; on or off", (*onOff)(&c.EmbedPostgres)},
		{"redis-url", "REDIS_URL", "Redis URL for the redis store", (*text)(&c.RedisURL)},
		{"redis-prefix", "LAB_REDIS_PREFIX", "prefix of every Redis key the lab writes", (*text)(&c.RedisPrefix)},
		{"embedded-redis", "LAB_EMBEDDED_REDIS", "without REDIS_URL, start an embedded Redis (miniredis); on or off", (*onOff)(&c.EmbedRedis)},
		{"redis-pair-primary", "LAB_REDIS_PAIR_PRIMARY", "redis:// URL of a running primary to fail over instead of the throwaway pair", (*text)(&c.RedisPairPrimary)},
		{"redis-pair-replica", "LAB_REDIS_PAIR_REPLICA", "redis:// URL of that primary's replica", (*text)(&c.RedisPairReplica)},
		{"redis-pair", "LAB_REDIS_PAIR", "start a throwaway Redis primary and replica (redis-server) for the failover fault; on or off", (*onOff)(&c.RedisPair)},
		{"log-level", "LAB_LOG_LEVEL", "debug, info, warn or error", (*text)(logLevel)},
	}
}

// declare puts the settings on fs, then applies the environment (lookup),
// so flags given on the command line win over it.
func declare(fs *flag.FlagSet, ss []setting, lookup func(string) (string, bool)) error {
	for _, s := range ss {
		fs.Var(s.value, s.flag, s.usage)
	}
	for _, s := range ss {
		if v, ok := lookup(s.env); ok && v != "" {
			if err := s.value.Set(v); err != nil {
				return fmt.Errorf("environment variable %s: %w", s.env, err)
			}
		}
	}
	return nil
}

// usage prints each setting as: -flag  env NAME  default VALUE, then what it does.
func usage(w io.Writer, name string, fs *flag.FlagSet, ss []setting) {
	fmt.Fprintf(w, "usage: %s [flags]\n\nflags (each also read from its environment variable; a flag wins):\n", name)
	listed := map[string]bool{}
	for _, s := range ss {
		def := fs.Lookup(s.flag).DefValue
		if def == "" {
			def = `""`
		}
		fmt.Fprintf(w, "  -%-20s env %-22s default %s\n      %s\n", s.flag, s.env, def, s.usage)
		listed[s.flag] = true
	}
	fs.VisitAll(func(f *flag.Flag) { // the command's own flags
		if !listed[f.Name] {
			fmt.Fprintf(w, "  -%-20s default %s\n      %s\n", f.Name, f.DefValue, f.Usage)
		}
	})
}

type text string

func (t *text) String() string     { return string(*t) }
func (t *text) Set(v string) error { *t = text(v); return nil }

type storeName lab.StoreName

func (s *storeName) String() string     { return string(*s) }
func (s *storeName) Set(v string) error { *s = storeName(v); return nil }

type duration time.Duration

// String prints 24h rather than 24h0m0s, as people write it.
func (d *duration) String() string {
	s := time.Duration(*d).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
func (d *duration) Set(v string) error {
	p, err := time.ParseDuration(v)
	if err != nil || p <= 0 {
		return fmt.Errorf("must be a positive duration such as 2s (got %q)", v)
	}
	*d = duration(p)
	return nil
}

type integer int

func (i *integer) String() string { return strconv.Itoa(int(*i)) }
func (i *integer) Set(v string) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("must be an integer (got %q)", v)
	}
	*i = integer(n)
	return nil
}

type onOff bool

func (b *onOff) String() string {
	if *b {
		return "on"
	}
	return "off"
}
func (b *onOff) Set(v string) error {
	switch v {
	case "on", "true", "1":
		*b = true
	case "off", "false", "0":
		*b = false
	default:
		return fmt.Errorf("must be on or off (got %q)", v)
	}
	return nil
}

type list []string

func (l *list) String() string { return strings.Join(*l, ",") }
func (l *list) Set(v string) error {
	*l = nil
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSuffix(strings.TrimSpace(p), "/"); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

type tenants map[string]string

func (t *tenants) String() string {
	pairs := make([]string, 0, len(*t))
	for token, tenant := range *t {
		pairs = append(pairs, token+":"+tenant)
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}
func (t *tenants) Set(v string) error {
	out := map[string]string{}
	for pair := range strings.SplitSeq(v, ",") {
		token, tenant, ok := strings.Cut(strings.TrimSpace(pair), ":")
		if !ok || token == "" || tenant == "" {
			return fmt.Errorf("must be token:tenant pairs separated by commas (got %q)", pair)
		}
		out[token] = tenant
	}
	*t = out
	return nil
}

// timeoutSettings are the server timeouts every command that serves takes
// (lab serve has them among its settings), under the same flags and
// environment variables.
func timeoutSettings(c *app.Config) []setting {
	return []setting{
		{"read-timeout", "LAB_READ_TIMEOUT", "bound on reading a whole request, so slow clients are closed (env LAB_READ_TIMEOUT)", (*duration)(&c.ReadTimeout)},
		{"write-timeout", "LAB_WRITE_TIMEOUT", "bound on a whole exchange (env LAB_WRITE_TIMEOUT)", (*duration)(&c.WriteTimeout)},
		{"idle-timeout", "LAB_IDLE_TIMEOUT", "idle keep-alive connections are closed after this (env LAB_IDLE_TIMEOUT)", (*duration)(&c.IdleTimeout)},
	}
}
