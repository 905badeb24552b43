// Package rediscache is PostgreSQL deciding with Redis in front as a cache
// only: the postgres store's one transaction decides every first attempt,
// and completed responses are cached in Redis so that replays are answered
// in one round trip. Losing Redis (a restart, a flush, an expiry) costs
// speed, never correctness: a miss falls back to PostgreSQL.
package rediscache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/variants/postgres"
)

// Name is the variant's name in the lab.
const Name lab.StoreName = "redis+postgres"

// Where a replay was read.
const (
	FromRedis    = "redis"
	FromPostgres = "postgres"
)

// Store answers replays from Redis and everything else from PostgreSQL.
type Store struct {
	db     *postgres.Store
	client *goredis.Client
	pair   *goredis.Client // the failover fault's Redis pair; nil without one
	prefix string
	now    lab.Clock
	log    *slog.Logger
}

// Config configures a Store; every field is required.
type Config struct {
	DB     *postgres.Store // decides, in its one transaction
	Client *goredis.Client
	// Pair, when set, is the lab's Redis primary and replica: a failover
	// run's attempts (redis=pair) keep their cache there.
	Pair   *goredis.Client
	Prefix string // every key the cache writes starts with it
	Now    lab.Clock
	Logger *slog.Logger
}

// New returns the cached store.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.DB == nil || cfg.Client == nil || cfg.Now == nil || cfg.Logger == nil:
		return nil, errors.New("redis+postgres: database store, Redis client, clock and logger are required")
	case cfg.Prefix == "":
		return nil, errors.New("redis+postgres: a key prefix is required, so the lab only ever touches its own keys")
	}
	return &Store{db: cfg.DB, client: cfg.Client, pair: cfg.Pair, prefix: cfg.Prefix + "cache:", now: cfg.Now, log: cfg.Logger}, nil
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// key is the cache key of a scope: namespace first, so one namespace's
// keys are found (and forgotten) without touching another's.
func (s *Store) key(sc lab.Scope) string {
	return s.prefix + string(sc.Namespace) + "|" + sc.Tenant + "|" + sc.Endpoint + "|" + sc.Key
}

// A cached value is "<fingerprint> <status> <expires, unix ms> <body>",
// read without decoding. The expiry is the key's own in PostgreSQL, on the
// lab's clock: the copy is never used past it, whatever Redis' clock says.
func encode(fingerprint string, r lab.Response, expires time.Time) []byte {
	b := make([]byte, 0, len(fingerprint)+20+len(r.Body))
	b = append(b, fingerprint...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, expires.UnixMilli(), 10)
	b = append(b, ' ')
	return append(b, r.Body...)
}

func decode(v []byte) (fingerprint string, r lab.Response, expires time.Time, ok bool) {
	fp, rest, ok1 := bytes.Cut(v, []byte{' '})
	st, rest, ok2 := bytes.Cut(rest, []byte{' '})
	exp, body, ok3 := bytes.Cut(rest, []byte{' '})
	status, err1 := strconv.Atoi(string(st))
	ms, err2 := strconv.ParseInt(string(exp), 10, 64)
	if !ok1 || !ok2 || !ok3 || err1 != nil || err2 != nil {
		return "", r, expires, false
	}
	return string(fp), lab.Response{Status: status, Body: body}, time.UnixMilli(ms), true
}

// Charge answers a replay from the cache when it holds the key, and goes to
// PostgreSQL otherwise; a completed answer from PostgreSQL is cached for
// exactly as long as PostgreSQL keeps its key.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	k := s.key(a.Scope)
	v, err := s.cache(a).Get(ctx, k).Bytes()
	switch {
	case err == nil:
		fp, resp, expires, ok := decode(v)
		switch {
		case !ok:
			s.log.WarnContext(ctx, "unreadable cache entry: asking PostgreSQL", "key", a.Scope.Key)
		case !s.now().Before(expires):
			// The key's retention ended: PostgreSQL decides what comes next.
		case fp != a.Fingerprint:
			return lab.Outcome{}, lab.ErrKeyReused
		default:
			lab.Mark(ctx, lab.PhaseReplay)
			return lab.Outcome{Response: resp, Replayed: true, ReplayedFrom: FromRedis}, nil
		}
	case !errors.Is(err, goredis.Nil):
		// The cache is down: PostgreSQL still decides, only slower.
		s.log.WarnContext(ctx, "cache unavailable: asking PostgreSQL", "err", err)
	}
	out, err := s.db.Charge(ctx, a)
	if err != nil || out.Pending != nil {
		return out, err
	}
	if out.Replayed {
		out.ReplayedFrom = FromPostgres
	}
	s.fill(ctx, a, out.Response)
	return out, nil
}

// cache is the Redis an attempt's copies live in: the pair for a failover
// run, the lab's Redis otherwise.
func (s *Store) cache(a lab.Attempt) *goredis.Client {
	if a.Faults.OnPair && s.pair != nil {
		return s.pair
	}
	return s.client
}

// fill caches a completed answer until its key expires in PostgreSQL,
// never longer: the cache must not answer for a key the database forgot.
func (s *Store) fill(ctx context.Context, a lab.Attempt, resp lab.Response) {
	expires, ok, err := s.db.Expiry(ctx, a.Scope, a.Fingerprint, resp)
	if err != nil || !ok {
		return // not completed (or unreadable): nothing to cache
	}
	ttl := expires.Sub(s.now())
	if ttl <= 0 {
		return
	}
	if err := s.cache(a).Set(ctx, s.key(a.Scope), encode(a.Fingerprint, resp, expires), ttl).Err(); err != nil {
		s.log.WarnContext(ctx, "could not fill the cache; replays will ask PostgreSQL", "err", err)
	}
}

// Lookup reports the key's state as PostgreSQL holds it: the cache only
// ever holds a copy.
func (s *Store) Lookup(ctx context.Context, sc lab.Scope) (lab.KeyState, error) {
	return s.db.Lookup(ctx, sc)
}

// Keys lists the keys PostgreSQL holds.
func (s *Store) Keys(ctx context.Context, ns lab.Namespace, limit int) ([]lab.KeyState, int, error) {
	return s.db.Keys(ctx, ns, limit)
}

// Reset forgets the namespace's keys in both places ("" for all):
// PostgreSQL first, so a fill racing the reset cannot outlive it there.
func (s *Store) Reset(ctx context.Context, ns lab.Namespace) error {
	if err := s.db.Reset(ctx, ns); err != nil {
		return err
	}
	return s.forget(ctx, lab.Region{Namespace: ns})
}

// Restart is Redis restarting without persistence: the region's cache is
// gone, PostgreSQL keeps every key, and replays fall back to it.
func (s *Store) Restart(ctx context.Context, r lab.Region) error { return s.forget(ctx, r) }

// forget deletes the region's cache entries (every entry with "").
func (s *Store) forget(ctx context.Context, r lab.Region) error {
	ns := "*"
	if r.Namespace != "" {
		ns = string(r.Namespace)
	}
	pattern := s.prefix + ns + "|*"
	if r.KeyPrefix != "" { // namespace|tenant|endpoint|key; the prefix holds no glob character
		pattern = s.prefix + ns + "|*|" + lab.Endpoint + "|" + r.KeyPrefix + "*"
	}
	iter := s.client.Scan(ctx, 0, pattern, 500).Iterator()
	var batch []string
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 500 {
			if err := s.client.Unlink(ctx, batch...).Err(); err != nil {
				return fmt.Errorf("error deleting cache entries: %w", err)
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("error listing cache entries: %w", err)
	}
	if len(batch) > 0 {
		if err := s.client.Unlink(ctx, batch...).Err(); err != nil {
			return fmt.Errorf("error deleting cache entries: %w", err)
		}
	}
	return nil
}

// Sweep sweeps PostgreSQL; Redis expires its copies by their TTL.
func (s *Store) Sweep(ctx context.Context) (int, error) { return s.db.Sweep(ctx) }

// OldestInFlight is PostgreSQL's: only it holds keys in flight.
func (s *Store) OldestInFlight(ctx context.Context) (time.Duration, error) {
	return s.db.OldestInFlight(ctx)
}

// Describe says where the keys live.
func (s *Store) Describe() string {
	return "PostgreSQL decides (table cached_requests, one transaction); Redis keys " + s.prefix + "* cache completed responses"
}
