package postgres

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// Config configures a Store; every field but ResetPools is required.
type Config struct {
	// Table holds the keys: idempotency_requests for this design; a design
	// built on it keeps its keys apart in a table of the same shape.
	Table   string
	Pool    *pgdb.Pool    // its search_path is the lab's schema (pgdb.Open); one budget per namespace, shared with every store on it
	Window  time.Duration // key retention
	Wait    time.Duration // bound on waiting for a connection, then for a twin in flight
	AppName string        // application_name shared by this lab's pools (store_restart kills them)
	// ResetPools drops the connections of every pool sharing AppName after
	// Restart killed their sessions; nil drops this store's pool only.
	ResetPools func()
	Now        lab.Clock // the time keys are created and expire by
}

// New returns the postgres store.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.Pool == nil || cfg.Now == nil:
		return nil, errors.New("postgres: pool and clock are required")
	case cfg.AppName == "":
		return nil, errors.New("postgres: an application_name is required, so a restart finds only this lab's sessions")
	case cfg.Window <= 0 || cfg.Wait <= 0:
		return nil, fmt.Errorf("postgres: window and wait must be positive (got %s, %s)", cfg.Window, cfg.Wait)
	case !keyTable.MatchString(cfg.Table):
		return nil, fmt.Errorf("postgres: key table %q must be a plain lower-case name", cfg.Table)
	}
	reset := cfg.ResetPools
	if reset == nil {
		reset = cfg.Pool.Raw().Reset
	}
	return &Store{table: cfg.Table, pool: cfg.Pool, window: cfg.Window, wait: cfg.Wait, appName: cfg.AppName,
		reset: reset, now: cfg.Now}, nil
}

// DefaultTable is the postgres design's key table.
const DefaultTable = "idempotency_requests"

var keyTable = regexp.MustCompile(`^[a-z_]{1,63}$`)

// q names the store's key table in a statement written for the default one.
func (s *Store) q(sql string) string {
	if s.table == DefaultTable {
		return sql
	}
	return strings.ReplaceAll(sql, DefaultTable, s.table)
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }
