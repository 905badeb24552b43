// Package postgres holds the design that holds: key, ledger entry, outbox
// event and stored response committed in one PostgreSQL transaction. It also
// keeps the shared books (ledger, outbox, receipts) whenever PostgreSQL is
// configured, whatever the store.
package postgres

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed schema.sql
var schemaSQL string

// DefaultSchema is where the lab keeps its tables.
const DefaultSchema = "idempotency_lab"

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// PoolConfig says how to connect.
type PoolConfig struct {
	URL      string // DATABASE_URL
	Schema   string // default DefaultSchema
	Size     int32  // max connections; default 20
	AppName  string // application_name, used to find this lab's connections
	Migrate  bool   // apply the schema after connecting
	Replica  string // for logs
	MinConns int32
}

// Open connects a pool whose search_path is the lab's schema, and applies
// the schema when asked.
func Open(ctx context.Context, cfg PoolConfig) (*pgxpool.Pool, error) {
	if cfg.Schema == "" {
		cfg.Schema = DefaultSchema
	}
	if !schemaName.MatchString(cfg.Schema) {
		return nil, fmt.Errorf("invalid schema name %q: lower-case letters, digits and _", cfg.Schema)
	}
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("error parsing DATABASE_URL: %w", err)
	}
	if cfg.Size > 0 {
		pc.MaxConns = cfg.Size
	} else {
		pc.MaxConns = 20
	}
	pc.MinConns = cfg.MinConns
	pc.ConnConfig.RuntimeParams["search_path"] = cfg.Schema
	if cfg.AppName != "" {
		pc.ConnConfig.RuntimeParams["application_name"] = cfg.AppName
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
			return err
		}
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return fmt.Errorf("error applying schema: %w", err)
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
	if !schemaName.MatchString(schema) || schema == "public" {
		return errors.New("refusing to drop schema " + schema)
	}
	_, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	return err
}
