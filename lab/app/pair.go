package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/redisdb"
)

// openPair starts the failover fault's primary and replica when asked and
// redis-server is installed; otherwise the fault says how to have it.
func (a *App) openPair(ctx context.Context) {
	if a.cfg.RedisPairPrimary != "" {
		p, err := redisdb.ConnectPair(ctx, a.cfg.RedisPairPrimary, a.cfg.RedisPairReplica)
		if err != nil {
			a.pairHow = "the given Redis pair does not answer as one: " + err.Error()
			a.cfg.Logger.Warn("failover fault unavailable", "err", err)
			return
		}
		a.pair = p
		a.cfg.Logger.Info("using the given Redis primary and replica for the failover fault", "primary", p.PrimaryAddr(), "replica", p.ReplicaAddr())
		return
	}
	switch {
	case !a.cfg.RedisPair:
		a.pairHow = "the Redis pair is off: run lab serve with -redis-pair on"
		return
	case len(a.cfg.Peers) > 0:
		a.pairHow = "in cluster mode every process must fail the same pair over: give it with -redis-pair-primary and -redis-pair-replica"
		return
	}
	if _, err := redisdb.FindServer(); err != nil {
		a.pairHow = err.Error()
		return
	}
	p, err := redisdb.StartPair(ctx)
	if err != nil {
		a.pairHow = "the Redis pair did not start: " + err.Error()
		a.cfg.Logger.Warn("failover fault unavailable", "err", err)
		return
	}
	a.pair = p
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
func (a *App) Failover(ctx context.Context, ns lab.Namespace, step string) (primary string, err error) {
	if a.pair == nil {
		return "", fmt.Errorf("%w: %s", lab.ErrStoreUnavailable, a.pairHow)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	a.failingMu.Lock()
	defer a.failingMu.Unlock()
	held, err := a.pair.Held(ctx)
	if err != nil {
		return "", fmt.Errorf("error reading the Redis pair: %w", err)
	}
	stale := !a.heldAt.IsZero() && time.Since(a.heldAt) > holdDeadline
	switch step {
	case "hold":
		if held && !stale {
			if a.waiting == "" || time.Since(a.waitingAt) > turnFor {
				a.waiting, a.waitingAt = ns, time.Now()
			}
			return "", lab.ErrFailoverUnderWay
		}
		if a.waiting != "" && a.waiting != ns && time.Since(a.waitingAt) <= turnFor {
			return "", lab.ErrFailoverUnderWay // the namespace refused last goes first
		}
		a.waiting = ""
		if held { // a hold nobody promoted: end it first
			a.cfg.Logger.Warn("ending a failover hold past its deadline", "held_by", a.holder)
			if err := a.pair.Promote(ctx); err != nil {
				return "", fmt.Errorf("error ending a stale hold: %w", err)
			}
		}
		if err := a.pair.HoldReplication(ctx); err != nil {
			if errors.Is(err, redisdb.ErrHeld) {
				return "", lab.ErrFailoverUnderWay // another process held it first
			}
			return "", fmt.Errorf("error holding replication back: %w", err)
		}
		a.holder, a.heldAt = ns, time.Now()
	case "promote":
		switch {
		case !held:
			return "", lab.Invalid("step", "no failover is under way: hold replication first")
		case a.holder != "" && a.holder != ns && !stale:
			return "", lab.ErrFailoverUnderWay // another namespace's failover
		}
		if err := a.pair.Promote(ctx); err != nil {
			return "", fmt.Errorf("error promoting the replica: %w", err)
		}
		a.holder, a.heldAt = "", time.Time{}
	default:
		return "", lab.Invalid("step", "must be hold or promote (got %q)", step)
	}
	return a.pair.PrimaryAddr(), nil
}

// PairUnavailable says why the failover fault cannot run here ("" when it can).
func (a *App) PairUnavailable() string {
	if a.pair != nil {
		return ""
	}
	return a.pairHow
}
