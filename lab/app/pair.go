package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/redisdb"
)

// redisFailover steps the lab's Redis pair through a failover, one
// namespace's at a time: the API's failover route and the failover runs
// reach it, and nothing else of the App.
type redisFailover struct {
	pair *redisdb.Pair // the failover fault's primary and replica; nil without redis-server
	how  string        // why there is no pair, and how to have one
	log  *slog.Logger

	mu     sync.Mutex    // one failover at a time; guards what follows
	holder lab.Namespace // who held the pair's replication back, if this process did
	heldAt time.Time
	// waiting is the namespace refused last while another held, and when:
	// it has the next turn for a moment.
	waiting   lab.Namespace
	waitingAt time.Time
}

// openPair starts the failover fault's primary and replica when asked and
// redis-server is installed; otherwise the fault says how to have it.
func (a *App) openPair(ctx context.Context) {
	a.failover = &redisFailover{log: a.cfg.Logger}
	f := a.failover
	if a.cfg.RedisPairPrimary != "" {
		p, err := redisdb.ConnectPair(ctx, a.cfg.RedisPairPrimary, a.cfg.RedisPairReplica)
		if err != nil {
			f.how = "the given Redis pair does not answer as one: " + err.Error()
			a.cfg.Logger.Warn("failover fault unavailable", "err", err)
			return
		}
		f.pair = p
		a.cfg.Logger.Info("using the given Redis primary and replica for the failover fault", "primary", p.PrimaryAddr(), "replica", p.ReplicaAddr())
		return
	}
	switch {
	case !a.cfg.RedisPair:
		f.how = "the Redis pair is off: run lab serve with -redis-pair on"
		return
	case len(a.cfg.Peers) > 0:
		f.how = "in cluster mode every process must fail the same pair over: give it with -redis-pair-primary and -redis-pair-replica"
		return
	}
	if _, err := redisdb.FindServer(); err != nil {
		f.how = err.Error()
		return
	}
	p, err := redisdb.StartPair(ctx)
	if err != nil {
		f.how = "the Redis pair did not start: " + err.Error()
		a.cfg.Logger.Warn("failover fault unavailable", "err", err)
		return
	}
	f.pair = p
	a.addCloser(p.Close)
	a.cfg.Logger.Info("started a Redis primary and replica for the failover fault", "primary", p.PrimaryAddr(), "replica", p.ReplicaAddr())
}

// holdDeadline is how long a hold may last before the next failover
// may end it: a run whose promote never came does not block the pair. A
// run promotes as soon as its first attempt answered, in well under it.
const holdDeadline = 5 * time.Second

// turnFor is how long a namespace refused while another held keeps the
// next turn: one namespace holding again and again cannot keep the others
// from ever failing over.
const turnFor = 2 * time.Second

// Failover steps the pair through a failover for namespace ns: "hold"
// stops replication (refused while another failover is under way),
// "promote" makes the replica the primary; only the namespace that held
// may promote, until the hold is past its deadline. The steps run to
// their end even if the caller leaves, so the pair is never left half
// failed over.
func (f *redisFailover) Failover(ctx context.Context, ns lab.Namespace, step string) (primary string, err error) {
	if f.pair == nil {
		return "", fmt.Errorf("%w: %s", lab.ErrStoreUnavailable, f.how)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	f.mu.Lock()
	defer f.mu.Unlock()
	held, err := f.pair.Held(ctx)
	if err != nil {
		return "", fmt.Errorf("error reading the Redis pair: %w", err)
	}
	stale := !f.heldAt.IsZero() && time.Since(f.heldAt) > holdDeadline
	switch step {
	case "hold":
		if held && !stale {
			if f.waiting == "" || time.Since(f.waitingAt) > turnFor {
				f.waiting, f.waitingAt = ns, time.Now()
			}
			return "", lab.ErrFailoverUnderWay
		}
		if f.waiting != "" && f.waiting != ns && time.Since(f.waitingAt) <= turnFor {
			return "", lab.ErrFailoverUnderWay // the namespace refused last goes first
		}
		f.waiting = ""
		if held { // a hold nobody promoted: end it first
			f.log.Warn("ending a failover hold past its deadline", "held_by", f.holder)
			if err := f.pair.Promote(ctx); err != nil {
				return "", fmt.Errorf("error ending a stale hold: %w", err)
			}
		}
		if err := f.pair.HoldReplication(ctx); err != nil {
			if errors.Is(err, redisdb.ErrHeld) {
				return "", lab.ErrFailoverUnderWay // another process held it first
			}
			return "", fmt.Errorf("error holding replication back: %w", err)
		}
		f.holder, f.heldAt = ns, time.Now()
	case "promote":
		switch {
		case !held:
			return "", lab.Invalid("step", "no failover is under way: hold replication first")
		case f.holder != "" && f.holder != ns && !stale:
			return "", lab.ErrFailoverUnderWay // another namespace's failover
		}
		if err := f.pair.Promote(ctx); err != nil {
			return "", fmt.Errorf("error promoting the replica: %w", err)
		}
		f.holder, f.heldAt = "", time.Time{}
	default:
		return "", lab.Invalid("step", "must be hold or promote (got %q)", step)
	}
	return f.pair.PrimaryAddr(), nil
}

// Unavailable says why the failover fault cannot run here ("" when it can).
func (f *redisFailover) Unavailable() string {
	if f.pair != nil {
		return ""
	}
	return f.how
}
