// Package pgdb is the lab's PostgreSQL: connection pools whose search_path is
// the lab's own schema, the embedded schema and its migration, and the books
// (ledger, outbox, provider receipts) that every store shares whenever
// PostgreSQL is configured.
package pgdb

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
)

//go:embed schema.sql
var schemaSQL string

// providerSQL holds the simulated provider's tables: its own records, kept
// apart from the lab's books even when both share a database.
//
//go:embed provider.sql
var providerSQL string

// DefaultSchema is where the lab keeps its tables.
const DefaultSchema = "idempotency_lab"

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// CheckSchema accepts a schema name the lab may own: lower-case letters,
// digits and _, and never public.
func CheckSchema(name string) error {
	if !schemaName.MatchString(name) || name == "public" {
		return fmt.Errorf("invalid schema name %q: lower-case letters, digits and _, and a schema of the lab's own (not public)", name)
	}
	return nil
}

// PoolConfig says how to connect.
type PoolConfig struct {
	URL     string // DATABASE_URL
	Schema  string // the lab's schema, e.g. DefaultSchema
	Size    int32  // max connections, at least 1
	AppName string // application_name, used to find this lab's connections
	Migrate bool   // apply the schema after connecting
	// AsyncCommit makes the pool's commits return before their WAL is
	// flushed (synchronous_commit = off): a crash may lose the last of
	// them, never corrupt anything. Only for writes whose loss is a repeat
	// the at-least-once path absorbs — a claim taken again, a delivery
	// acknowledged again and deduplicated downstream — never for the
	// ledger, a key or a payment state.
	AsyncCommit bool
	// BeforeConnect, when set, may change where each new connection goes
	// (a pair's current primary, after a failover).
	BeforeConnect func(context.Context, *pgx.ConnConfig) error
	// Tracer, when set, sees every statement (cost.SQL counts them).
	Tracer pgx.QueryTracer
}

// Open connects a pool whose search_path is the lab's schema, and applies
// the schema when asked.
func Open(ctx context.Context, cfg PoolConfig) (*pgxpool.Pool, error) {
	if err := CheckSchema(cfg.Schema); err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("error parsing DATABASE_URL: %w", err)
	}
	if cfg.Size < 1 {
		return nil, fmt.Errorf("pool size must be at least 1 (got %d)", cfg.Size)
	}
	pc.MaxConns = cfg.Size
	pc.ConnConfig.RuntimeParams["search_path"] = cfg.Schema
	if cfg.AppName != "" {
		pc.ConnConfig.RuntimeParams["application_name"] = cfg.AppName
	}
	if cfg.AsyncCommit {
		pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	pc.BeforeConnect = cfg.BeforeConnect
	if cfg.Tracer != nil {
		pc.ConnConfig.Tracer = cfg.Tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("error creating pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("error connecting to PostgreSQL: %w", err)
	}
	if cfg.Migrate {
		if err := Migrate(ctx, pool, cfg.Schema); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}

// Migrate applies the embedded schema in one transaction under an advisory
// lock, so replicas starting together do not race on CREATE … IF NOT EXISTS.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('idempotency-lab migrate ' || $1))", schema); err != nil {
			return fmt.Errorf("error taking the migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return fmt.Errorf("error creating schema %s: %w", schema, err)
		}
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return fmt.Errorf("error setting search_path: %w", err)
		}
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return fmt.Errorf("error applying schema: %w", err)
		}
		if _, err := tx.Exec(ctx, providerSQL); err != nil {
			return fmt.Errorf("error applying the provider's schema: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("error migrating schema %s: %w", schema, err)
	}
	return nil
}

// DropSchema removes the lab's schema and everything in it (tests use a
// schema of their own; the server never calls this).
func DropSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if err := CheckSchema(schema); err != nil {
		return fmt.Errorf("refusing to drop schema: %w", err)
	}
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("error dropping schema %s: %w", schema, err)
	}
	return nil
}

// ConnectionLost reports errors after which a transaction can simply run
// again on a fresh connection: the session died (terminated, server shut
// down) or the network dropped before the outcome was known to the server.
func ConnectionLost(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03": // admin shutdown, crash shutdown, cannot connect now
			return true
		}
		return false
	}
	var ne net.Error
	return pgconn.SafeToRetry(err) || errors.Is(err, pgconn.ErrConnClosed) || errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// InNamespace is the condition that a row belongs to namespace ns, or to any
// when ns is "" (the admin's view), with ns passed as parameter $n. It has
// two forms rather than one condition OR-ing both, whose plan, once reused
// for every call, cannot walk the (namespace, created_at) index.
func InNamespace(ns lab.Namespace, n int) string {
	if ns == "" {
		return fmt.Sprintf("$%d = ''", n)
	}
	return fmt.Sprintf("namespace = $%d", n)
}
