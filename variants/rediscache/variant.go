package rediscache

import (
	"context"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants/postgres"
)

// Variant declares the cached store to the registry.
func Variant() variant.Variant {
	return variant.Variant{
		Name:        Name,
		Label:       "Redis cache, PostgreSQL decides",
		Decides:     "PostgreSQL's one transaction decides (as postgres); Redis only caches completed responses, so a replay is one Redis round trip",
		Keys:        "PostgreSQL table cached_requests decides; Redis holds copies of completed responses until the key expires",
		RequiresKey: true,
		Effects:     "outbox",
		Crash:       variant.CrashRollsBack, // PostgreSQL decides; the cache is filled only after the commit
		Needs:       []variant.Need{variant.NeedPostgres, variant.NeedRedis},
		HowToEnable: "set DATABASE_URL and REDIS_URL (or run lab serve with the throwaway PostgreSQL and the embedded Redis, the defaults)",
		Open: func(_ context.Context, d variant.Deps) (lab.Store, error) {
			db, err := postgres.New(postgres.Config{Table: "cached_requests", Pool: d.Postgres, Window: d.Window, Wait: d.Wait,
				AppName: d.AppName, ResetPools: d.ResetPools, Now: d.Clock})
			if err != nil {
				return nil, err
			}
			return New(Config{DB: db, Client: d.Redis, Pair: d.RedisPair, Prefix: d.RedisPrefix, Now: d.Clock, Logger: d.Logger})
		},
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries: {Usual: lab.Holds, Holds: "PostgreSQL's unique key picks one owner; the twins wait on its row lock and replay, later replays come from Redis",
				Breaks: "the unique key did not stop a duplicate"},
			variant.CaseReplicas: {Usual: lab.Holds, Holds: "every replica decides in the same PostgreSQL table and reads the same Redis cache",
				Breaks: "the unique key did not stop a duplicate across replicas"},
			variant.FaultCase(lab.FaultSlow): {Usual: lab.Holds, Holds: "PostgreSQL's row lock lasts as long as the transaction: the cache holds only what was committed",
				Breaks: "slowness let a twin in"},
			variant.FaultCase(lab.FaultCrashAfterClaim): {Usual: lab.Holds, Holds: "the crash rolled back the open transaction, claim included; nothing was cached: the retry charged once",
				Breaks: "the rolled-back claim still let two charges in"},
			variant.FaultCase(lab.FaultCrashAfterCharge): {Usual: lab.Holds, Holds: "key, charge and response committed together in PostgreSQL; the cache missed and the retry replayed from PostgreSQL",
				Breaks: "the lost response led to a second charge"},
			variant.FaultCase(lab.FaultOutboxFail): {Usual: lab.Holds, Holds: "the failed outbox insert rolled back charge and key together; the retry charged once",
				Breaks: "the failed write left a charge behind"},
			variant.FaultCase(lab.FaultAppliedResponseLost): variant.RelayReplaysCapture(),
			variant.FaultCase(lab.FaultStoreRestart): {Usual: lab.Holds, Holds: "Redis restarted empty, which cost only speed: the replay fell back to PostgreSQL, which still held the key",
				Breaks: "the restart lost a committed key"},
			variant.FaultCase(lab.FaultExpired): {Usual: lab.Breaks, Holds: "after the window the key is reclaimed, but the unique (tenant, order_id) constraint refuses a second charge",
				Breaks: "past the retention window the key is new again in PostgreSQL, and the cache expired with it: the late retry charges again"},
			variant.FaultCase(lab.FaultStaleWorker): {Usual: lab.Holds, Holds: "PostgreSQL decides and held the paused worker's transaction open: the retry waited and replayed (a connection and a row lock held for the pause)",
				Breaks: "the pause outlasted the bounded wait"},
			variant.FaultCase(lab.FaultFailover): {Usual: lab.Holds, Holds: "PostgreSQL decides; whatever a Redis failover loses is only a cached copy",
				Breaks: "a duplicate got in"},
			variant.FaultCase(lab.FaultPGFailover): {Usual: lab.Breaks, UsualWith: variant.ReplicationDecides,
				Holds:  "synchronous replication: the PostgreSQL commit waited for the standby and never returned, so nothing was acknowledged or cached; the retry charged once on the new primary",
				Breaks: "asynchronous replication: the primary acknowledged the charge and Redis cached its answer; the promoted standby never received the charge, so the retries were answered with a charge the surviving books do not hold, which the provider captured all the same"},
			variant.CaseReused: {Usual: lab.Holds, Holds: "the stored fingerprint differs (in Redis and in PostgreSQL): the other amount gets 422",
				Breaks: "the other amount was charged"},
			variant.CaseTenants: {Usual: lab.Holds, Holds: "keys carry the tenant in both places: each tenant is charged once",
				Breaks: "the tenants' keys collided"},
		},
	}
}
