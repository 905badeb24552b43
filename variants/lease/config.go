package lease

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

// Store claims keys in lease_requests and writes charges fenced by the
// claim's token.
type Store struct {
	pool   *pgdb.Pool    // every connection taken for a namespace, within its budget
	window time.Duration // retention of completed keys
	wait   time.Duration // how long a twin waits before 202 Accepted
	lease  time.Duration // default lifetime of a claim
	now    lab.Clock
	log    *slog.Logger
	// signals are the store's named points a test can wait on (armed by
	// export_test.go); outside tests each is one nil check.
	signals struct {
		claimed  testsignal.Values[int64] // phase one committed: the token won
		renewing testsignal.Values[int64] // the heartbeat started for the token
	}
	// stepClaims names the stepped attempts that won tokens (stepping.go).
	stepClaims stepClaims
}

// Config configures a Store; every field is required.
type Config struct {
	Pool   *pgdb.Pool // search_path is the lab's schema; one budget per namespace, shared with every store on it
	Window time.Duration
	Wait   time.Duration
	Lease  time.Duration
	Now    lab.Clock
	Logger *slog.Logger
}

// New returns the lease store.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.Pool == nil || cfg.Now == nil || cfg.Logger == nil:
		return nil, errors.New("lease: pool, clock and logger are required")
	case cfg.Window <= 0 || cfg.Wait <= 0 || cfg.Lease <= 0:
		return nil, fmt.Errorf("lease: window, wait and lease must be positive (got %s, %s, %s)", cfg.Window, cfg.Wait, cfg.Lease)
	}
	return &Store{pool: cfg.Pool, window: cfg.Window, wait: cfg.Wait, lease: cfg.Lease, now: cfg.Now, log: cfg.Logger}, nil
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// Describe says where the keys live.
func (s *Store) Describe() string {
	return fmt.Sprintf("PostgreSQL table lease_requests: a committed claim with a %s lease and a fencing token the ledger checks", s.lease)
}
