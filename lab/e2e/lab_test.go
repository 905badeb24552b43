package e2e_test

import (
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants"
	"github.com/idempotency-lab/lab/variants/lease"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/phases"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
)

// labConfig is the lab as the command builds it — the defaults and every
// built-in variant — on a free loopback port and with no embedded
// services, changed by opts.
func labConfig(opts ...func(*app.Config)) app.Config {
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr = "127.0.0.1:0"
	cfg.EmbedPostgres, cfg.EmbedRedis = false, false
	cfg.RedisPair = false // two redis-server processes per lab: only the tests that fail over start them
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// idempotentStores lists the idempotent stores every contract test covers.
// Those needing a service fail without it under LAB_REQUIRE_SERVICES=1.
func idempotentStores(t *testing.T) []lab.StoreName {
	t.Helper()
	return []lab.StoreName{memory.Name, redis.Name, postgres.Name}
}

// storeConfig returns a lab configuration in which store is available.
func storeConfig(t *testing.T, store lab.StoreName) app.Config {
	t.Helper()
	switch store {
	case postgres.Name, lease.Name, phases.Name:
		url, schema := labtest.Postgres(t)
		return labConfig(func(c *app.Config) { c.DatabaseURL, c.PGSchema = url, schema })
	case redis.Name:
		url, prefix := labtest.Redis(t)
		return labConfig(func(c *app.Config) { c.RedisURL, c.RedisPrefix = url, prefix })
	}
	return labConfig()
}

// fullConfig configures every store, with the ledger in PostgreSQL.
func fullConfig(t *testing.T) app.Config {
	t.Helper()
	url, schema := labtest.Postgres(t)
	redisURL, prefix := labtest.Redis(t)
	return labConfig(func(c *app.Config) {
		c.DatabaseURL, c.PGSchema, c.RedisURL, c.RedisPrefix = url, schema, redisURL, prefix
	})
}
