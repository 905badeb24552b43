package redis

// What a stepped run asks of this design beyond its pause points: the
// claim's TTL, or a completed record's retention, made to run out at one
// move on the server (PEXPIRE to zero, which Redis treats as the TTL's
// end), and the key as Redis holds it, with the time it has left.

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
)

// expireIfHeld ends a value's lifetime now while it is still the one read.
var expireIfHeld = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], 0)
end
return 0`)

// MakeHappen makes a time-driven event happen to the key now: "ttl" ends
// an in-flight claim's TTL, "window" a completed record's retention.
func (s *Store) MakeHappen(ctx context.Context, sc lab.Scope, e lab.TimeEvent) error {
	switch e {
	case lab.EventTTL:
		return s.expire(ctx, sc, lab.KeyInFlight)
	case lab.EventWindow:
		return s.expire(ctx, sc, lab.KeyCompleted)
	case lab.EventWait:
		return nil // a twin's wait is the attempt's own (lab.WaitBound), which the move has ended
	}
	return lab.Invalid("event", "%s has no %s to end: a claim here lives by its TTL (ttl), a record by its retention (window)", Name, e)
}

// TimeMoves are the events a redis key lives by; failover needs a stepped
// run started with fault=failover.
func (s *Store) TimeMoves() []lab.TimeEvent {
	return []lab.TimeEvent{lab.EventTTL, lab.EventWindow, lab.EventFailover, lab.EventWait}
}

// expire ends the key's value now if it is in state; anything else is left.
func (s *Store) expire(ctx context.Context, sc lab.Scope, state string) error {
	k := s.key(sc)
	held, err := s.client.Get(ctx, k).Result()
	switch {
	case errors.Is(err, goredis.Nil):
		return nil // nothing under the key: nothing to run out
	case err != nil:
		return fmt.Errorf("%w: error reading the key: %w", lab.ErrStoreUnavailable, err)
	}
	d, err := decode(held)
	if err != nil || d.state != state {
		return err
	}
	if err := expireIfHeld.Run(ctx, s.client, []string{k}, held).Err(); err != nil {
		return fmt.Errorf("%w: error ending the key's lifetime: %w", lab.ErrStoreUnavailable, err)
	}
	return nil
}

// Inspect reads the key as Redis holds it: a claim and its TTL, an
// unsettled claim, or the completed record and its retention left. A key
// only the failover pair holds (a failover run's) is read there.
func (s *Store) Inspect(ctx context.Context, sc lab.Scope) (lab.KeyInspection, error) {
	in, err := s.inspect(ctx, sc)
	if err != nil || in.State != lab.KeyAbsent || s.onPair == nil || s.onPair == s {
		return in, err
	}
	return s.onPair.inspect(ctx, sc)
}

func (s *Store) inspect(ctx context.Context, sc lab.Scope) (lab.KeyInspection, error) {
	k := s.key(sc)
	in := lab.KeyInspection{Where: "Redis, " + s.where, State: lab.KeyAbsent, Facts: []string{}, Shared: true}
	pipe := s.client.Pipeline()
	get, ttl := pipe.Get(ctx, k), pipe.PTTL(ctx, k)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
		return in, fmt.Errorf("%w: error reading the key: %w", lab.ErrStoreUnavailable, err)
	}
	held, err := get.Result()
	if errors.Is(err, goredis.Nil) {
		in.Facts = append(in.Facts, "no value under the key")
		return in, nil
	}
	d, err := decode(held)
	if err != nil {
		return in, err
	}
	left := fmt.Sprintf("%.1f s", ttl.Val().Seconds())
	switch {
	case d.unsettled:
		in.State = "unsettled"
		in.Facts = append(in.Facts, fmt.Sprintf("unsettled claim keeping charge id %s for the next attempt, %s left", d.chargeID, left))
	case d.state == lab.KeyInFlight:
		in.State = lab.KeyInFlight
		in.Facts = append(in.Facts, fmt.Sprintf("claim for charge %s, TTL %s left", d.chargeID, left))
	default:
		in.State = lab.KeyCompleted
		in.Facts = append(in.Facts, fmt.Sprintf("record: response %d stored, retention %s left", d.rec.Status, left))
	}
	return in, nil
}
