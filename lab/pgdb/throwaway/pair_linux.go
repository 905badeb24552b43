//go:build linux

package throwaway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Replication is when a primary acknowledges a commit: at once (Async,
// PostgreSQL's default: the standby may not have it yet), or once its
// standby has flushed it (Sync: synchronous_standby_names names it).
type Replication string

// The pair's replication modes.
const (
	Async Replication = "async"
	Sync  Replication = "sync"
)

// standbyName is the standby's application_name, which
// synchronous_standby_names names in Sync mode.
const standbyName = "lab_standby"

// holdTimeout bounds how long Hold waits for the standby to stop receiving.
const holdTimeout = 20 * time.Second

// Pair is a throwaway primary and its streaming standby, for failing
// PostgreSQL over: hold replication, promote the standby, read both, then
// rebuild a standby from the new primary. It is not safe for concurrent use.
type Pair struct {
	mode    Replication
	primary *Cluster
	standby *Cluster
	old     *Cluster // the primary before the last promotion, until Rebuild
}

// StartPair starts a primary (initdb) and a standby streaming from it
// (pg_basebackup -R), replicating in mode.
func StartPair(ctx context.Context, logger *slog.Logger, mode Replication) (*Pair, error) {
	if mode != Async && mode != Sync {
		return nil, fmt.Errorf("replication %q: want %s or %s", mode, Async, Sync)
	}
	// Commits wait for the server's own WAL flush, as a real primary's do;
	// in Sync mode, for the standby's too.
	primary, err := Start(ctx, logger, "synchronous_commit=on")
	if err != nil {
		return nil, err
	}
	p := &Pair{mode: mode, primary: primary}
	if err := p.attachStandby(ctx); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	return p, nil
}

// Primary is the server that takes writes now.
func (p *Pair) Primary() *Cluster { return p.primary }

// Standby is the server streaming from the primary, nil once promoted and
// until Rebuild.
func (p *Pair) Standby() *Cluster { return p.standby }

// Old is the primary the last Promote replaced, still running so that what
// it committed can be read, until Rebuild discards it (nil otherwise).
func (p *Pair) Old() *Cluster { return p.old }

// attachStandby makes a fresh standby of the primary and sets the
// primary's synchronous_standby_names for the pair's mode.
func (p *Pair) attachStandby(ctx context.Context) error {
	s, err := p.primary.startStandby(ctx)
	if err != nil {
		return err
	}
	p.standby = s
	return p.replicate(ctx)
}

// replicate sets the primary's synchronous_standby_names for the pair's
// mode and waits until the standby streams that way.
func (p *Pair) replicate(ctx context.Context) error {
	names := ""
	if p.mode == Sync {
		names = `"` + standbyName + `"`
	}
	if err := p.primary.setConf(ctx, "synchronous_standby_names", names); err != nil {
		return err
	}
	return p.waitStreaming(ctx)
}

// setConf sets a server setting on c and reloads it (ALTER SYSTEM takes
// no parameters: value is written as a quoted literal).
func (c *Cluster) setConf(ctx context.Context, name, value string) error {
	if err := c.query(ctx, "ALTER SYSTEM SET "+name+" = '"+strings.ReplaceAll(value, "'", "''")+"'", nil); err != nil {
		return err
	}
	return c.query(ctx, "SELECT pg_reload_conf()", nil)
}

// waitStreaming waits until the primary streams to the standby (and, in
// Sync mode, counts it as synchronous): before, a Sync commit would wait.
func (p *Pair) waitStreaming(ctx context.Context) error {
	want := "async"
	if p.mode == Sync {
		want = "sync"
	}
	return p.primary.await(ctx, "the standby streaming ("+want+")", `
		SELECT EXISTS (SELECT 1 FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2)`,
		standbyName, want)
}

// Hold stops the standby receiving WAL, as a network partition would: its
// primary_conninfo is pointed at a port nobody listens on and reloaded.
// It returns once the primary has no walsender for it, so a commit after
// Hold is on the primary alone (and, in Sync mode, waits).
func (p *Pair) Hold(ctx context.Context) error {
	if p.standby == nil {
		return errors.New("no standby to hold: promoted, not rebuilt")
	}
	nowhere := fmt.Sprintf("host=127.0.0.1 port=1 user=%s application_name=%s", superuser, standbyName)
	if err := p.standby.setConf(ctx, "primary_conninfo", nowhere); err != nil {
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, holdTimeout)
	defer cancel()
	return p.primary.await(hctx, "the primary's walsender to the held standby gone", `
		SELECT NOT EXISTS (SELECT 1 FROM pg_stat_replication WHERE application_name = $1)`, standbyName)
}

// Promote ends the standby's recovery (pg_promote): it becomes the primary,
// with what it had received. The old primary keeps running, as one the
// failover did not reach does, until Rebuild.
func (p *Pair) Promote(ctx context.Context) error {
	if p.standby == nil {
		return errors.New("no standby to promote")
	}
	var done bool
	if err := p.standby.query(ctx, "SELECT pg_promote(true, 30)", nil, &done); err != nil || !done {
		return fmt.Errorf("error promoting the standby (done %v): %w", done, err)
	}
	p.old, p.primary, p.standby = p.primary, p.standby, nil
	p.primary.logger.Info("promoted the PostgreSQL standby", "primary", p.primary.port, "old", p.old.port)
	// Alone now: a synchronous standby named in a setting it copied would
	// make its every commit wait for a standby that is not there yet.
	return p.primary.setConf(ctx, "synchronous_standby_names", "")
}

// Replication is how the pair replicates now.
func (p *Pair) Replication() Replication { return p.mode }

// SetReplication switches the pair to mode (the primary's
// synchronous_standby_names) and waits until its standby streams that way.
func (p *Pair) SetReplication(ctx context.Context, mode Replication) error {
	if mode != Async && mode != Sync {
		return fmt.Errorf("replication %q: want %s or %s", mode, Async, Sync)
	}
	if mode == p.mode {
		return nil
	}
	if p.standby == nil {
		return errors.New("no standby to replicate to: promoted, not rebuilt")
	}
	p.mode = mode
	return p.replicate(ctx)
}

// AwaitCommitWaiting waits until a session of the primary is committing
// and waits for its synchronous standby (wait event SyncRep): its commit
// is on the primary's disk, not yet acknowledged.
func (p *Pair) AwaitCommitWaiting(ctx context.Context) error {
	return p.primary.await(ctx, "a commit waiting for the synchronous standby",
		`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep')`)
}

// Rebuild discards the old primary and makes a fresh standby of the new
// one, so the next failover starts from a whole pair.
func (p *Pair) Rebuild(ctx context.Context) error {
	if p.old != nil {
		if err := p.old.Close(); err != nil {
			return err
		}
		p.old = nil
	}
	if p.standby != nil {
		return nil
	}
	return p.attachStandby(ctx)
}

// Close stops every server of the pair and removes their files.
func (p *Pair) Close() error {
	var errs []error
	for _, c := range []*Cluster{p.standby, p.old, p.primary} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// startStandby copies c (pg_basebackup -R, writing its primary_conninfo
// and standby.signal) into a cluster of its own, and starts it.
func (c *Cluster) startStandby(ctx context.Context) (*Cluster, error) {
	s, binDir, cred, err := newCluster(c.logger, c.settings)
	if err != nil {
		return nil, err
	}
	dataDir := filepath.Join(s.dir, "data")
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=%s", c.port, superuser, standbyName)
	backup := exec.CommandContext(ctx, filepath.Join(binDir, "pg_basebackup"),
		"-D", dataDir, "-d", conninfo, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	if err := s.run(backup, cred); err != nil {
		return nil, errors.Join(fmt.Errorf("error running pg_basebackup: %w\n%s", err, s.logTail(0)), s.Close())
	}
	if err := s.serve(ctx, binDir, dataDir, cred); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	c.logger.Info("started a PostgreSQL standby", "primary", c.port, "port", s.port, "pid", s.pid)
	return s, nil
}

// query runs one statement on c's "postgres" database, scanning its row
// into dest when given.
func (c *Cluster) query(ctx context.Context, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, c.urlFor("postgres"))
	if err != nil {
		return fmt.Errorf("error connecting to PostgreSQL on port %d: %w", c.port, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if len(dest) == 0 {
		_, err = conn.Exec(ctx, sql, args...)
	} else {
		err = conn.QueryRow(ctx, sql, args...).Scan(dest...)
	}
	if err != nil {
		return fmt.Errorf("error running %q on port %d: %w", sql, c.port, err)
	}
	return nil
}

// await polls query (one boolean) on c until it is true: the state of a
// replication link is another process's, seen only by asking.
func (c *Cluster) await(ctx context.Context, what, query string, args ...any) error {
	for {
		var ok bool
		err := c.query(ctx, query, args, &ok)
		if err == nil && ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s on port %d: %w (last error: %v)", what, c.port, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// WaitCaughtUp waits until the standby has replayed all the primary has
// written so far: what was there before a failover survives it.
func (p *Pair) WaitCaughtUp(ctx context.Context) error {
	if p.standby == nil {
		return errors.New("no standby to catch up")
	}
	var lsn string
	if err := p.primary.query(ctx, "SELECT pg_current_wal_lsn()::text", nil, &lsn); err != nil {
		return err
	}
	return p.standby.await(ctx, "the standby replaying up to "+lsn,
		"SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", lsn)
}
