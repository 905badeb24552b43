package app_test

import (
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// idempotentStores lists the idempotent stores every contract test covers.
// Those needing a service fail without it under LAB_REQUIRE_SERVICES=1.
func idempotentStores(t *testing.T) []string {
	t.Helper()
	return []string{lab.StoreMemory, lab.StoreRedis, lab.StorePostgres}
}

// storeConfig returns a lab configuration in which store is available.
func storeConfig(t *testing.T, store string) app.Config {
	t.Helper()
	switch store {
	case lab.StorePostgres:
		url, schema := labtest.Postgres(t)
		return app.Config{DatabaseURL: url, PGSchema: schema}
	case lab.StoreRedis:
		url, prefix := labtest.Redis(t)
		return app.Config{RedisURL: url, RedisPrefix: prefix}
	}
	return app.Config{}
}

// fullConfig configures every store, with the ledger in PostgreSQL.
func fullConfig(t *testing.T) app.Config {
	t.Helper()
	url, schema := labtest.Postgres(t)
	redisURL, prefix := labtest.Redis(t)
	return app.Config{DatabaseURL: url, PGSchema: schema, RedisURL: redisURL, RedisPrefix: prefix}
}
