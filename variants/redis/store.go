// Package redis holds the design that survives replicas but not every
// failure: a SET NX claim with a TTL in Redis, the completed response cached
// under the same key, and the ledger in another system.
//
// This file is the design, and the path every attempt takes: the claim, the
// charge, the completion and the replay, in that order. Beside it:
// record.go (what a key's value holds), keys.go (listing and clearing the
// lab's keys), pair.go (the failover lesson's primary and replica).
package redis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
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
	// wake tells twins in this process that a claim they wait on settled,
	// so they look again at once; twins on other replicas poll.
	wake lab.Wakeups
}

// Config configures a Store; every field but Where and Pair is required.
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
	s.onPair = s.pair(cfg.Pair)
	return s, nil
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// key scopes by namespace, tenant and endpoint; escaping keeps the parts
// apart and leaves no glob character, so a namespace's keys are one SCAN
// pattern (see keys.go).
func (s *Store) key(sc lab.Scope) string {
	return s.nsPrefix(sc.Namespace) + url.QueryEscape(sc.Tenant) + "|" + url.QueryEscape(sc.Endpoint) + "|" + url.QueryEscape(sc.Key)
}

func (s *Store) nsPrefix(ns lab.Namespace) string {
	return s.prefix + "idem:" + url.QueryEscape(string(ns)) + "|"
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
	if on, err := s.routed(a); on != s || err != nil {
		if err != nil {
			return lab.Outcome{}, err
		}
		return on.Charge(ctx, a)
	}
	k := s.key(a.Scope)
	ttl := s.claimTTL
	if a.Faults.ClaimTTL > 0 {
		ttl = a.Faults.ClaimTTL
	}
	if err := lab.Pause(ctx, lab.PointBeforeClaim); err != nil {
		return lab.Outcome{}, err
	}
	var wait context.Context // the bounded wait, from the first look at a twin in flight
	backoff := 2 * time.Millisecond
	for {
		a.ChargeID = lab.NewChargeID()
		claim := claimValue(uuid.NewString(), a.Fingerprint, s.now(), a.ChargeID)
		// SET k claim NX PX ttl GET: only the first attempt's claim is set;
		// every other attempt is told, in the same command, what the key holds.
		// The claim is marked as it is sent: its TTL runs from a moment in
		// Redis no earlier, so its end is never drawn after it came.
		claimed := lab.MarkBefore(ctx, lab.PhaseClaim)
		held, won, err := s.claimOrRead(ctx, k, claim, ttl)
		switch {
		case err != nil:
			return lab.Outcome{}, fmt.Errorf("%w: redis claim failed: %w", lab.ErrStoreUnavailable, err)
		case won:
			claimed()
			s.listClaim(ctx, a.Scope, k)
			return s.perform(ctx, k, claim, a, false)
		case held == "":
			continue // expired or deleted between the SET and the GET: claim again
		}
		d, err := decode(held)
		if err != nil {
			return lab.Outcome{}, err
		}
		switch {
		case d.fingerprint != a.Fingerprint:
			return lab.Outcome{}, lab.ErrKeyReused
		case d.state == lab.KeyCompleted:
			// The replay: the first attempt's status and body, as they were sent.
			lab.Mark(ctx, lab.PhaseReplay)
			return lab.Outcome{Response: lab.Response{Status: d.rec.Status, Body: d.rec.Body}, Replayed: true}, nil
		case d.unsettled:
			// Take it over with its charge id: if the lost commit landed, the
			// ledger returns that charge instead of applying a second one.
			a.ChargeID = d.chargeID
			claim = claimValue(uuid.NewString(), a.Fingerprint, s.now(), d.chargeID)
			claimed := lab.MarkBefore(ctx, lab.PhaseClaim)
			ok, err := swap.Run(ctx, s.client, []string{k}, held, claim, ttl.Milliseconds()).Int()
			if err != nil {
				return lab.Outcome{}, fmt.Errorf("%w: redis claim failed: %w", lab.ErrStoreUnavailable, err)
			}
			if ok == 1 {
				claimed()
				return s.perform(ctx, k, claim, a, true)
			}
			continue
		}
		// In flight: look again when the owner settles here (a twin in this
		// process) or after a backoff (an owner on another replica), until
		// the bounded wait runs out, looking once more at its very end.
		if wait == nil {
			var stop context.CancelFunc
			wait, stop = lab.WaitBound(ctx, s.wait)
			defer stop()
		} else if wait.Err() != nil && ctx.Err() == nil {
			return lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
		}
		if err := s.wake.Wait(wait, k, backoff); err != nil && ctx.Err() != nil {
			return lab.Outcome{}, err
		}
		backoff = min(backoff*3/2, 100*time.Millisecond)
	}
}

// claimOrRead sets the claim when the key is absent (won), and otherwise
// changes nothing and answers what the key holds ("" if it vanished before
// the look): SET k claim NX PX ttl GET, one round trip (Redis 7.0 or later).
func (s *Store) claimOrRead(ctx context.Context, k, claim string, ttl time.Duration) (held string, won bool, err error) {
	held, err = s.client.SetArgs(ctx, k, claim, goredis.SetArgs{Mode: "NX", TTL: ttl, Get: true}).Result()
	if errors.Is(err, goredis.Nil) {
		return "", true, nil
	}
	return held, false, err
}

// perform charges behind a claim. An inherited claim carries the charge id
// of an unsettled key, which must never be given up on a failure.
func (s *Store) perform(ctx context.Context, k, claim string, a lab.Attempt, inherited bool) (lab.Outcome, error) {
	defer s.wake.Settled(k) // completed, released, kept unsettled or left behind: twins here look again now
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		return lab.Outcome{}, lab.ErrCrash // the claim stays behind until its TTL
	}
	if err := lab.Pause(ctx, lab.PointAfterClaim); err != nil && !inherited {
		return lab.Outcome{}, errors.Join(err, release.Run(context.WithoutCancel(ctx), s.client, []string{k}, claim).Err())
	}
	resp, err := lab.Perform(ctx, s.ledger, a, s.now())
	retention := a.Faults.RetentionOr(s.window)
	if errors.Is(err, lab.ErrOutcomeUnknown) || err != nil && inherited {
		// Maybe charged (now, or by the lost commit whose id this claim
		// carries): keep the key, and the charge id, for the next attempt.
		if serr := swap.Run(context.WithoutCancel(ctx), s.client, []string{k}, claim, unsettledValue(claim), retention.Milliseconds()).Err(); serr != nil {
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
	pauseErr := lab.Pause(ctx, lab.PointAfterCharge) // charged: the record is written even if it gives up here
	// Complete: swap our claim for the response. If the claim expired
	// mid-work the record is not written: the charge stands, and whoever
	// holds the key now may charge again. That is the lesson of a lock TTL
	// shorter than the work. The charge happened: record it even if the
	// client has gone.
	rec := (record{Fingerprint: a.Fingerprint, Status: resp.Status, Body: resp.Body, CreatedAt: s.now().UTC()}).value()
	commit := lab.MarkBefore(ctx, lab.PhaseCommit) // as the record is sent: no twin reads it sooner
	stored, err := swap.Run(context.WithoutCancel(ctx), s.client, []string{k}, claim, rec, retention.Milliseconds()).Int()
	if err != nil {
		return lab.Outcome{}, fmt.Errorf("%w: storing the response failed after the charge: %w", lab.ErrStoreUnavailable, err)
	}
	if stored == 1 { // not when the claim had expired: the record was never written
		commit()
	}
	if pauseErr != nil {
		return lab.Outcome{}, pauseErr
	}
	return lab.Outcome{Response: resp}, nil
}
