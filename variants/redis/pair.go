package redis

import (
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
)

// The failover lesson runs its attempts on the lab's primary and replica
// pair (redis=pair), where the primary can be lost before it replicated.

// pair returns this store's twin on the pair's client, nil without one.
func (s *Store) pair(client *goredis.Client) *Store {
	if client == nil {
		return nil
	}
	p := &Store{client: client, ledger: s.ledger, prefix: s.prefix, window: s.window, wait: s.wait,
		claimTTL: s.claimTTL, where: "the lab's primary and replica pair", now: s.now}
	p.onPair = p // on the pair, every attempt stays there
	return p
}

// routed is the store an attempt claims in: the pair for a failover run,
// this store otherwise.
func (s *Store) routed(a lab.Attempt) (*Store, error) {
	switch {
	case !a.Faults.OnPair:
		return s, nil
	case s.onPair == nil:
		return nil, fmt.Errorf("%w: the failover lesson needs the lab's Redis pair: install redis-server (apt-get install redis-server) and keep -redis-pair on", lab.ErrStoreUnavailable)
	}
	return s.onPair, nil
}

// stores are this store and, when it has one, its twin on the pair: a
// reset or a restart clears both.
func (s *Store) stores() []*Store {
	if s.onPair != nil && s.onPair != s {
		return []*Store{s, s.onPair}
	}
	return []*Store{s}
}
