package app

import (
	"context"
	"errors"
	"fmt"

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

// Failover steps the pair through a failover: "hold" stops replication
// (refused while another failover is under way), "promote" makes the
// replica the primary and lets the next failover begin.
func (a *App) Failover(ctx context.Context, step string) (primary string, err error) {
	if a.pair == nil {
		return "", fmt.Errorf("%w: %s", lab.ErrStoreUnavailable, a.pairHow)
	}
	a.failingMu.Lock()
	defer a.failingMu.Unlock()
	switch step {
	case "hold":
		err = a.pair.HoldReplication(ctx)
		if errors.Is(err, redisdb.ErrHeld) {
			return "", lab.ErrFailoverUnderWay
		}
	case "promote":
		held, herr := a.pair.Held(ctx)
		if herr != nil {
			return "", fmt.Errorf("error reading the Redis pair: %w", herr)
		}
		if !held {
			return "", lab.Invalid("step", "no failover is under way: hold replication first")
		}
		err = a.pair.Promote(ctx)
	default:
		return "", lab.Invalid("step", "must be hold or promote (got %q)", step)
	}
	if err != nil {
		return "", fmt.Errorf("error in failover step %s: %w", step, err)
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
