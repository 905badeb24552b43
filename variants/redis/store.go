// Package redis holds the design that survives replicas but not every
// failure: a SET NX claim with a TTL in Redis, the completed response cached
// under the same key, and the ledger in another system.
package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
)

// Store claims keys in Redis with SET NX PX and caches completed responses.
type Store struct {
	client   *goredis.Client
	ledger   lab.Ledger
	prefix   string
	window   time.Duration
	wait     time.Duration
	claimTTL time.Duration
	where    string
	now      lab.Clock
	// onPair is this store on the lab's primary and replica pair, for the
	// attempts of a failover run; nil without a pair.
	onPair *Store
	// wake lets this process's twins of a claim look again as soon as it
	// settles here, rather than at their next poll.
	wake lab.Wakeups
}

// Config configures a Store; every field but Where is required.
type Config struct {
	Client   *goredis.Client
	Ledger   lab.Ledger
	Prefix   string        // every key the store writes starts with it
	Window   time.Duration // retention of completed records
	Wait     time.Duration // bounded wait for an in-flight twin
	ClaimTTL time.Duration // lifetime of a claim
	Where    string        // how the server is reached, for Describe
	Now      lab.Clock
	// Pair, when set, is a client of the lab's primary and replica pair:
	// attempts carrying redis=pair claim there.
	Pair *goredis.Client
}

// New returns a redis store.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.Client == nil || cfg.Ledger == nil || cfg.Now == nil:
		return nil, errors.New("redis: client, ledger and clock are required")
	case cfg.Prefix == "":
		return nil, errors.New("redis: a key prefix is required, so the lab only ever touches its own keys")
	case cfg.Window <= 0 || cfg.Wait <= 0 || cfg.ClaimTTL <= 0:
		return nil, fmt.Errorf("redis: window, wait and claim TTL must be positive (got %s, %s, %s)", cfg.Window, cfg.Wait, cfg.ClaimTTL)
	}
	s := &Store{client: cfg.Client, ledger: cfg.Ledger, prefix: cfg.Prefix, window: cfg.Window, wait: cfg.Wait,
		claimTTL: cfg.ClaimTTL, where: cfg.Where, now: cfg.Now}
	if cfg.Pair != nil {
		pair := &Store{client: cfg.Pair, ledger: cfg.Ledger, prefix: cfg.Prefix, window: cfg.Window, wait: cfg.Wait,
			claimTTL: cfg.ClaimTTL, where: "the lab's primary and replica pair", now: cfg.Now}
		pair.onPair = pair // on the pair, every attempt stays there
		s.onPair = pair
	}
	return s, nil
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// record is the completed response cached under a key.
type record struct {
	Fingerprint string    `json:"fingerprint"`
	Status      int       `json:"status"`
	Body        []byte    `json:"body"`
	CreatedAt   time.Time `json:"created_at"`
}

// A completed key holds "done|<fingerprint>|<status>|<created unix ms>|"
// followed by the response body as it was sent: a replay reads it with
// no JSON or base64 decoding. (Records written as JSON by earlier versions
// are still read.)
const donePrefix = "done|"

func (r record) value() string {
	var b strings.Builder
	b.Grow(len(donePrefix) + len(r.Fingerprint) + 24 + len(r.Body))
	b.WriteString(donePrefix)
	b.WriteString(r.Fingerprint)
	b.WriteByte('|')
	b.WriteString(strconv.Itoa(r.Status))
	b.WriteByte('|')
	b.WriteString(strconv.FormatInt(r.CreatedAt.UnixMilli(), 10))
	b.WriteByte('|')
	b.Write(r.Body)
	return b.String()
}

func parseDone(v string) (record, error) {
	parts := strings.SplitN(v, "|", 4) // fingerprint, status, created at, body (which may hold '|')
	if len(parts) != 4 {
		return record{}, fmt.Errorf("error decoding record: %d fields", len(parts))
	}
	status, err := strconv.Atoi(parts[1])
	if err != nil {
		return record{}, fmt.Errorf("error decoding record status: %w", err)
	}
	ms, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return record{}, fmt.Errorf("error decoding record time: %w", err)
	}
	return record{Fingerprint: parts[0], Status: status, CreatedAt: time.UnixMilli(ms).UTC(), Body: []byte(parts[3])}, nil
}

// A claim's value names its owner, the request it is for, when it was taken
// and the charge it may apply. An unsettled value keeps that charge id when
// the ledger's answer was lost, so the next claimant retries the same charge.
const (
	claimPrefix     = "claim|"
	unsettledPrefix = "unsettled|"
)

func claimValue(token, fingerprint string, now time.Time, chargeID string) string {
	return claimPrefix + token + "|" + fingerprint + "|" + strconv.FormatInt(now.UnixMilli(), 10) + "|" + chargeID
}

// decoded is what a key currently holds.
type decoded struct {
	state       string // lab.KeyInFlight or lab.KeyCompleted
	fingerprint string
	chargeID    string
	unsettled   bool // in flight with no owner: its charge's outcome is unknown
	rec         record
}

func decode(v string) (decoded, error) {
	rest, claimed := strings.CutPrefix(v, claimPrefix)
	if !claimed {
		rest, claimed = strings.CutPrefix(v, unsettledPrefix)
	}
	if claimed {
		parts := strings.SplitN(rest, "|", 4) // token, fingerprint, claimed at (unix ms), charge id
		d := decoded{state: lab.KeyInFlight, unsettled: strings.HasPrefix(v, unsettledPrefix)}
		if len(parts) == 4 {
			ms, _ := strconv.ParseInt(parts[2], 10, 64)
			d.fingerprint, d.rec.CreatedAt, d.chargeID = parts[1], time.UnixMilli(ms).UTC(), parts[3]
		}
		return d, nil
	}
	var r record
	var err error
	if rest, ok := strings.CutPrefix(v, donePrefix); ok {
		r, err = parseDone(rest)
	} else {
		err = json.Unmarshal([]byte(v), &r)
	}
	if err != nil {
		return decoded{}, fmt.Errorf("error decoding record: %w", err)
	}
	return decoded{state: lab.KeyCompleted, fingerprint: r.Fingerprint, rec: r}, nil
}

// key scopes by namespace, tenant and endpoint; escaping keeps the parts
// apart and leaves no glob character, so a namespace's keys are one SCAN
// pattern (see pattern).
func (s *Store) key(sc lab.Scope) string {
	return s.nsPrefix(sc.Namespace) + url.QueryEscape(sc.Tenant) + "|" + url.QueryEscape(sc.Endpoint) + "|" + url.QueryEscape(sc.Key)
}

func (s *Store) nsPrefix(ns lab.Namespace) string {
	return s.prefix + "idem:" + url.QueryEscape(string(ns)) + "|"
}

// pattern matches the namespace's keys ("" for every namespace's).
func (s *Store) pattern(ns lab.Namespace) string {
	if ns == "" {
		return s.prefix + "idem:*"
	}
	return s.nsPrefix(ns) + "*"
}

// swap replaces a value only while it is still the one we hold: a claim that
// expired mid-work may belong to someone else now.
var swap = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0`)

// release deletes the claim only while it is still ours.
var release = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// Charge claims the key, charges the ledger, then caches the response.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	if a.Faults.OnPair && s.onPair != s && s.onPair != nil {
		return s.onPair.Charge(ctx, a)
	}
	if a.Faults.OnPair && s.onPair == nil {
		return lab.Outcome{}, fmt.Errorf("%w: the failover lesson needs the lab's Redis pair: install redis-server (apt-get install redis-server) and keep -redis-pair on", lab.ErrStoreUnavailable)
	}
	k := s.key(a.Scope)
	ttl := s.claimTTL
	if a.Faults.ClaimTTL > 0 {
		ttl = a.Faults.ClaimTTL
	}
	deadline := time.Now().Add(s.wait)
	backoff := 2 * time.Millisecond
	for {
		a.ChargeID = lab.NewChargeID()
		claim := claimValue(uuid.NewString(), a.Fingerprint, s.now(), a.ChargeID)
		// Claim or read in one round trip: SET NX GET sets the claim when
		// the key is absent (answering nil) and otherwise changes nothing
		// and answers what the key holds, so a replay costs one command.
		v, err := s.client.SetArgs(ctx, k, claim, goredis.SetArgs{Mode: "NX", TTL: ttl, Get: true}).Result()
		switch {
		case errors.Is(err, goredis.Nil):
			s.listClaim(ctx, a.Scope, k)
			return s.perform(ctx, k, claim, a, false)
		case err != nil:
			return lab.Outcome{}, fmt.Errorf("%w: redis claim failed: %w", lab.ErrStoreUnavailable, err)
		}
		d, err := decode(v)
		if err != nil {
			return lab.Outcome{}, err
		}
		switch {
		case d.fingerprint != a.Fingerprint:
			return lab.Outcome{}, lab.ErrKeyReused
		case d.state == lab.KeyCompleted:
			return lab.Outcome{Response: lab.Response{Status: d.rec.Status, Body: d.rec.Body}, Replayed: true}, nil
		case d.unsettled:
			// Take it over with its charge id: if the lost commit landed, the
			// ledger returns that charge instead of applying a second one.
			a.ChargeID = d.chargeID
			claim = claimValue(uuid.NewString(), a.Fingerprint, s.now(), d.chargeID)
			ok, err := swap.Run(ctx, s.client, []string{k}, v, claim, ttl.Milliseconds()).Int()
			if err != nil {
				return lab.Outcome{}, fmt.Errorf("%w: redis claim failed: %w", lab.ErrStoreUnavailable, err)
			}
			if ok == 1 {
				return s.perform(ctx, k, claim, a, true)
			}
			continue
		}
		// In flight: poll with backoff until the bounded wait runs out,
		// looking once more at its very end.
		left := time.Until(deadline)
		if left <= 0 {
			return lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
		}
		if err := s.wake.Wait(ctx, k, min(backoff, left)); err != nil {
			return lab.Outcome{}, err
		}
		backoff = min(backoff*3/2, 100*time.Millisecond)
	}
}

// perform charges behind a claim. An inherited claim carries the charge id
// of an unsettled key, which must never be given up on a failure.
func (s *Store) perform(ctx context.Context, k, claim string, a lab.Attempt, inherited bool) (lab.Outcome, error) {
	defer s.wake.Settled(k) // completed, released, kept unsettled or left behind: twins here look again now
	lab.Mark(ctx, lab.PhaseClaim)
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		return lab.Outcome{}, lab.ErrCrash // the claim stays behind until its TTL
	}
	resp, err := lab.Perform(ctx, s.ledger, a, s.now())
	if errors.Is(err, lab.ErrOutcomeUnknown) || err != nil && inherited {
		// Maybe charged (now, or by the lost commit whose id this claim
		// carries): keep the key, and the charge id, for the next attempt.
		retention := a.Faults.RetentionOr(s.window)
		unsettled := unsettledPrefix + strings.TrimPrefix(claim, claimPrefix)
		if serr := swap.Run(context.WithoutCancel(ctx), s.client, []string{k}, claim, unsettled, retention.Milliseconds()).Err(); serr != nil {
			err = errors.Join(err, fmt.Errorf("error keeping the unsettled charge: %w", serr))
		}
		return lab.Outcome{}, err
	}
	if err != nil {
		// Nothing was charged: give the key back so a retry can run.
		if rerr := release.Run(context.WithoutCancel(ctx), s.client, []string{k}, claim).Err(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("error releasing claim: %w", rerr))
		}
		return lab.Outcome{}, err
	}
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		return lab.Outcome{}, lab.ErrCrash // charged in the ledger; Redis never hears of it
	}
	retention := a.Faults.RetentionOr(s.window)
	rec := record{Fingerprint: a.Fingerprint, Status: resp.Status, Body: resp.Body, CreatedAt: s.now().UTC()}.value()
	// If the claim expired mid-work the record is not written: the charge
	// stands, and whoever holds the key now may charge again. That is the
	// lesson of a lock TTL shorter than the work.
	// The charge happened: record it even if the client has gone.
	if err := swap.Run(context.WithoutCancel(ctx), s.client, []string{k}, claim, rec, retention.Milliseconds()).Err(); err != nil {
		return lab.Outcome{}, fmt.Errorf("%w: storing the response failed after the charge: %w", lab.ErrStoreUnavailable, err)
	}
	return lab.Outcome{Response: resp}, nil
}

// Lookup reports one key's state.
func (s *Store) Lookup(ctx context.Context, sc lab.Scope) (lab.KeyState, error) {
	v, err := s.client.Get(ctx, s.key(sc)).Result()
	if errors.Is(err, goredis.Nil) {
		return lab.KeyState{Tenant: sc.Tenant, Key: sc.Key, State: lab.KeyAbsent}, nil
	}
	if err != nil {
		return lab.KeyState{}, fmt.Errorf("error reading key: %w", err)
	}
	d, err := decode(v)
	if err != nil {
		return lab.KeyState{}, err
	}
	return lab.KeyState{Tenant: sc.Tenant, Key: sc.Key, State: d.state, Fingerprint: d.fingerprint, Status: d.rec.Status,
		CreatedAt: d.rec.CreatedAt, AgeMS: s.now().Sub(d.rec.CreatedAt).Milliseconds(), Response: d.rec.Body}, nil
}

// scan visits every key of a namespace ("" for all the lab's keys).
func (s *Store) scan(ctx context.Context, ns lab.Namespace, visit func(keys []string) error) error {
	return s.scanPattern(ctx, s.pattern(ns), visit)
}

// scanPattern visits every key matching pattern, in batches.
func (s *Store) scanPattern(ctx context.Context, pattern string, visit func(keys []string) error) error {
	var cursor uint64
	for {
		keys, next, err := s.client.Scan(ctx, cursor, pattern, 500).Result()
		if err != nil {
			return fmt.Errorf("error scanning keys: %w", err)
		}
		if len(keys) > 0 {
			if err := visit(keys); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// index is the sorted set listing a namespace's keys by claim time, so
// /idempotency/state reads the newest few instead of scanning them all.
func (s *Store) index(ns lab.Namespace) string {
	return s.prefix + "keys:" + url.QueryEscape(string(ns))
}

// listClaim adds a won claim's key to its namespace's listing, and drops
// entries older than the retention window. The listing is advisory: no
// decision reads it, so a failure here costs only a line in the listing.
func (s *Store) listClaim(ctx context.Context, sc lab.Scope, k string) {
	idx, now := s.index(sc.Namespace), s.now().UnixMilli()
	_, _ = s.client.Pipelined(context.WithoutCancel(ctx), func(p goredis.Pipeliner) error {
		p.ZAdd(ctx, idx, goredis.Z{Score: float64(now), Member: k})
		p.ZRemRangeByScore(ctx, idx, "-inf", strconv.FormatInt(now-s.window.Milliseconds(), 10))
		p.PExpire(ctx, idx, s.window)
		return nil
	})
}

// Keys lists a namespace's newest keys ("" for every namespace's) from its
// listing: what it costs grows with limit, not with the keys held.
func (s *Store) Keys(ctx context.Context, ns lab.Namespace, limit int) ([]lab.KeyState, int, error) {
	indexes := []string{s.index(ns)}
	if ns == "" { // the admin's view: every namespace's listing (one key each)
		indexes = nil
		err := s.scanPattern(ctx, s.prefix+"keys:*", func(keys []string) error {
			indexes = append(indexes, keys...)
			return nil
		})
		if err != nil {
			return nil, 0, fmt.Errorf("error listing namespaces: %w", err)
		}
	}
	var out []lab.KeyState
	total, now := 0, s.now()
	for _, idx := range indexes {
		n, err := s.client.ZCard(ctx, idx).Result()
		if err != nil {
			return nil, 0, fmt.Errorf("error counting keys: %w", err)
		}
		members, err := s.client.ZRangeArgs(ctx, goredis.ZRangeArgs{Key: idx, Start: 0, Stop: limit - 1, Rev: true}).Result()
		if err != nil {
			return nil, 0, fmt.Errorf("error listing keys: %w", err)
		}
		if len(members) == 0 {
			continue
		}
		vals, err := s.client.MGet(ctx, members...).Result()
		if err != nil {
			return nil, 0, fmt.Errorf("error reading keys: %w", err)
		}
		var gone []any
		for i, v := range vals {
			str, ok := v.(string)
			d, err := decode(str)
			if !ok || err != nil {
				gone = append(gone, members[i]) // expired or deleted since it was listed
				continue
			}
			parts := strings.SplitN(strings.TrimPrefix(members[i], s.prefix+"idem:"), "|", 4) // namespace, tenant, endpoint, key
			ks := lab.KeyState{State: d.state, Fingerprint: d.fingerprint, Status: d.rec.Status,
				CreatedAt: d.rec.CreatedAt, AgeMS: now.Sub(d.rec.CreatedAt).Milliseconds()}
			if len(parts) == 4 {
				ks.Tenant, _ = url.QueryUnescape(parts[1])
				ks.Key, _ = url.QueryUnescape(parts[3])
			}
			out = append(out, ks)
		}
		if len(gone) > 0 {
			_ = s.client.ZRem(ctx, idx, gone...).Err() // advisory, as in listClaim
		}
		total += int(n) - len(gone)
	}
	slices.SortFunc(out, func(x, y lab.KeyState) int { return y.CreatedAt.Compare(x.CreatedAt) })
	return out[:min(limit, len(out))], total, nil
}

// Reset deletes a namespace's keys ("" for all the lab's keys), and only those.
func (s *Store) Reset(ctx context.Context, ns lab.Namespace) error {
	if s.onPair != nil && s.onPair != s {
		if err := s.onPair.deleteAll(ctx, ns); err != nil {
			return fmt.Errorf("error resetting the Redis pair: %w", err)
		}
	}
	return s.deleteAll(ctx, ns)
}

// Restart loses the region's keys (a namespace's, "" for all the lab's, or
// only those under a key prefix), as Redis restarting without persistence
// loses every key. Only the lab's own keys are deleted, never the whole
// database, and one attendee's restart never touches another's keys.
func (s *Store) Restart(ctx context.Context, r lab.Region) error {
	if r.KeyPrefix == "" {
		return s.Reset(ctx, r.Namespace)
	}
	stores := []*Store{s}
	if s.onPair != nil && s.onPair != s {
		stores = append(stores, s.onPair)
	}
	for _, st := range stores {
		err := st.scanPattern(ctx, st.confined(r), func(keys []string) error { return st.client.Unlink(ctx, keys...).Err() })
		if err != nil {
			return fmt.Errorf("error deleting keys under %q: %w", r.KeyPrefix, err)
		}
	}
	return nil
}

// confined matches the region's keys under its prefix: the tenant and the
// endpoint are escaped (no '|' inside them), and so is the prefix, which
// holds no glob character (lab.CheckKeyPrefix).
func (s *Store) confined(r lab.Region) string {
	ns := s.prefix + "idem:*|"
	if r.Namespace != "" {
		ns = s.nsPrefix(r.Namespace)
	}
	return ns + "*|*|" + url.QueryEscape(r.KeyPrefix) + "*"
}

func (s *Store) deleteAll(ctx context.Context, ns lab.Namespace) error {
	listings := []string{s.index(ns)}
	if ns == "" {
		listings = []string{s.prefix + "keys:*"}
	}
	for _, pattern := range listings {
		if err := s.scanPattern(ctx, pattern, func(keys []string) error { return s.client.Unlink(ctx, keys...).Err() }); err != nil {
			return fmt.Errorf("error deleting key listings: %w", err)
		}
	}
	return s.scan(ctx, ns, func(keys []string) error {
		if err := s.client.Unlink(ctx, keys...).Err(); err != nil {
			return fmt.Errorf("error deleting keys: %w", err)
		}
		return nil
	})
}

// Sweep has nothing to do: Redis expires keys by their TTL.
func (s *Store) Sweep(context.Context) (int, error) { return 0, nil }
