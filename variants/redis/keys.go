package redis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
)

// What the lab reads and clears of the store's keys: one key's state, the
// newest keys of a namespace, a reset and a restart. No decision reads any
// of it.

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

// pattern matches the namespace's keys ("" for every namespace's).
func (s *Store) pattern(ns lab.Namespace) string {
	if ns == "" {
		return s.prefix + "idem:*"
	}
	return s.nsPrefix(ns) + "*"
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
	for _, st := range s.stores() {
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
	return s.scanPattern(ctx, s.pattern(ns), func(keys []string) error {
		if err := s.client.Unlink(ctx, keys...).Err(); err != nil {
			return fmt.Errorf("error deleting keys: %w", err)
		}
		return nil
	})
}

// Sweep has nothing to do: Redis expires keys by their TTL.
func (s *Store) Sweep(context.Context) (int, error) { return 0, nil }
