//go:build !linux

package throwaway

import (
	"context"
	"errors"
	"log/slog"
)

// errUnsupported explains why there is no throwaway cluster here: the server
// must run as another user and die with the lab, which this package does
// only with Linux's process controls.
var errUnsupported = errors.New("the throwaway PostgreSQL cluster runs on Linux only; set DATABASE_URL")

// Cluster is a running throwaway PostgreSQL server (never, on this system).
type Cluster struct{}

// Find reports that no throwaway cluster can run here.
func Find() (string, error) { return "", errUnsupported }

// Start reports that no throwaway cluster can run here.
func Start(context.Context, *slog.Logger, ...string) (*Cluster, error) { return nil, errUnsupported }

// URL is empty: there is no cluster.
func (c *Cluster) URL() string { return "" }

// PID is zero: there is no cluster.
func (c *Cluster) PID() int { return 0 }

// Close has nothing to stop.
func (c *Cluster) Close() error { return nil }

// Port is zero: there is no cluster.
func (c *Cluster) Port() int { return 0 }

// Replication is when a pair's primary acknowledges a commit.
type Replication string

// The pair's replication modes.
const (
	Async Replication = "async"
	Sync  Replication = "sync"
)

// Pair is a primary and its standby (never, on this system).
type Pair struct{}

// StartPair reports that no throwaway pair can run here.
func StartPair(context.Context, *slog.Logger, Replication) (*Pair, error) { return nil, errUnsupported }

// Primary is nil: there is no pair.
func (p *Pair) Primary() *Cluster { return nil }

// Standby is nil: there is no pair.
func (p *Pair) Standby() *Cluster { return nil }

// Old is nil: there is no pair.
func (p *Pair) Old() *Cluster { return nil }

// Replication is empty: there is no pair.
func (p *Pair) Replication() Replication { return "" }

// SetReplication reports that there is no pair.
func (p *Pair) SetReplication(context.Context, Replication) error { return errUnsupported }

// Hold reports that there is no pair.
func (p *Pair) Hold(context.Context) error { return errUnsupported }

// AwaitCommitWaiting reports that there is no pair.
func (p *Pair) AwaitCommitWaiting(context.Context) error { return errUnsupported }

// Promote reports that there is no pair.
func (p *Pair) Promote(context.Context) error { return errUnsupported }

// Rebuild reports that there is no pair.
func (p *Pair) Rebuild(context.Context) error { return errUnsupported }

// Close has nothing to stop.
func (p *Pair) Close() error { return nil }

// WaitCaughtUp reports that there is no pair.
func (p *Pair) WaitCaughtUp(context.Context) error { return errUnsupported }
