package phases

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// Store runs charges in atomic phases recorded in phase_requests.
type Store struct {
	pool          *pgdb.Pool    // every connection taken for a namespace, within its budget
	provider      lab.Capturer  // the inline capture of phase three
	window        time.Duration // retention of finished keys
	lock          time.Duration // how long a worker holds a key between two commits
	completeAfter time.Duration // how long past its lock an unfinished key waits for its client before the completer takes it
	now           lab.Clock
	log           *slog.Logger
}

// Config configures a Store; every field is required.
type Config struct {
	Pool     *pgdb.Pool // search_path is the lab's schema
	Provider lab.Capturer
	Window   time.Duration
	Lock     time.Duration
	// CompleteAfter is how long a key's lock must have been over before
	// the completer finishes it: the client's chance to retry first.
	CompleteAfter time.Duration
	Now           lab.Clock
	Logger        *slog.Logger
}

// New returns the phases store.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.Pool == nil || cfg.Provider == nil || cfg.Now == nil || cfg.Logger == nil:
		return nil, errors.New("phases: pool, provider, clock and logger are required")
	case cfg.Window <= 0 || cfg.Lock <= 0 || cfg.CompleteAfter <= 0:
		return nil, fmt.Errorf("phases: window, lock and complete-after must be positive (got %s, %s, %s)", cfg.Window, cfg.Lock, cfg.CompleteAfter)
	}
	return &Store{pool: cfg.Pool, provider: cfg.Provider, window: cfg.Window, lock: cfg.Lock, completeAfter: cfg.CompleteAfter,
		now: cfg.Now, log: cfg.Logger}, nil
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// Describe says where the keys live.
func (s *Store) Describe() string {
	return fmt.Sprintf("PostgreSQL table phase_requests: each key's recovery point, locked %s at a time by a token every phase checks; the completer takes keys left unfinished %s past their lock", s.lock, s.completeAfter)
}
