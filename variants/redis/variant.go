package redis

import (
	"context"
	"fmt"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Name is the variant's name in the lab.
const Name lab.StoreName = "redis"

// Variant declares the redis store to the registry.
func Variant() variant.Variant {
	return variant.Variant{
		Name:        Name,
		Label:       "SET NX + TTL",
		Decides:     "SET key claim NX PX ttl, the response cached under the key",
		Keys:        "Redis, under the lab's key prefix, claimed with SET NX PX",
		RequiresKey: true,
		Effects:     "outbox",
		Crash:       variant.CrashLeavesClaim,
		Lifetime:    "claim TTL",
		Needs:       []variant.Need{variant.NeedRedis},
		HowToEnable: "set REDIS_URL (e.g. redis://127.0.0.1:6379/0), or run lab serve with the embedded Redis (the default)",
		Open: func(_ context.Context, d variant.Deps) (lab.Store, error) {
			return New(Config{Client: d.Redis, Ledger: d.Ledger, Prefix: d.RedisPrefix, Window: d.Window,
				Wait: d.Wait, ClaimTTL: d.ClaimTTL, Where: d.RedisWhere, Now: d.Clock, Pair: d.RedisPair})
		},
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries: {Usual: lab.Holds, Holds: "SET NX lets one attempt claim the key; the others poll for the completed record and replay it",
				Breaks: "SET NX did not stop a duplicate"},
			variant.CaseReplicas: {Usual: lab.Holds, Holds: "every replica claims in the same Redis: one SET NX wins across them all",
				Breaks: "the shared claim did not stop a duplicate"},
			variant.FaultCase(lab.FaultSlow): {Usual: lab.Breaks, UsualWith: claimOutlivesWork,
				Holds:  "the claim outlived the work (ttl_ms ≥ work_ms): the twins waited and replayed",
				Breaks: "the claim's TTL ran out while the first attempt was still working: a retry claimed the free key and charged again"},
			variant.FaultCase(lab.FaultCrashAfterClaim): {Usual: lab.Holds, Holds: "the claim stayed behind without a charge: retries got 409 until its TTL, then one of them charged once",
				Breaks: "the stale claim expired and more than one retry charged"},
			variant.FaultCase(lab.FaultCrashAfterCharge): {Usual: lab.Breaks, Holds: "the retries gave up before the stale claim expired",
				Breaks: "the charge committed in the ledger but the completed record never reached Redis: the claim expired and a retry charged again — key and ledger share no commit"},
			variant.FaultCase(lab.FaultOutboxFail): {Usual: lab.Holds, Holds: "the ledger refused the charge with its event; the claim was released (compare-and-delete on its token) and the retry charged once",
				Breaks: "the failed write left a charge behind"},
			variant.FaultCase(lab.FaultAppliedResponseLost): variant.RelayReplaysCapture(),
			variant.FaultCase(lab.FaultStoreRestart): {Usual: lab.Breaks, Holds: "the record survived the restart",
				Breaks: "Redis without persistence restarted empty: the completed record is gone, so the retry charges again"},
			variant.FaultCase(lab.FaultExpired): {Usual: lab.Breaks, Holds: "the order id's unique constraint in the ledger refused the second charge",
				Breaks: "the record expired with its TTL: the late retry is a new operation"},
			variant.FaultCase(lab.FaultStaleWorker): {Usual: lab.Breaks, Holds: "the retry came before the claim expired",
				Breaks: "the paused worker's claim expired with its TTL: the retry claimed the free key and charged, then the worker woke and charged too — nothing in the ledger knows its claim is gone"},
			variant.FaultCase(lab.FaultFailover): {Usual: lab.Breaks, Holds: "the record had replicated before the failover",
				Breaks: "the primary acknowledged the claim and the record, then the replica was promoted before they replicated (replication was held back by pointing the replica at a dead port): the new primary had never heard of the key, and the retry charged again — a lock in an asynchronously replicated store is not a lock"},
			variant.CaseReused: {Usual: lab.Holds, Holds: "the stored fingerprint differs: the other amount gets 422 and charges nothing",
				Breaks: "the other amount was charged"},
			variant.CaseTenants: {Usual: lab.Holds, Holds: "Redis keys carry tenant and endpoint: each tenant is charged once",
				Breaks: "the tenants' keys collided"},
		},
	}
}

// claimOutlivesWork: a claim that comfortably outlives the slow work holds.
func claimOutlivesWork(f lab.Faults) lab.Verdict {
	if f.ClaimTTL >= f.Work+f.Work/2 {
		return lab.Holds
	}
	return lab.Breaks
}

// Describe says where the keys live, with the server and the claim TTL.
func (s *Store) Describe() string {
	return fmt.Sprintf("Redis %s, keys %s*, claimed with SET NX PX (claim TTL %s)", s.where, s.prefix, s.claimTTL)
}
