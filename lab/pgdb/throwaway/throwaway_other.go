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
