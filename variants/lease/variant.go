package lease

import (
	"context"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Name is the variant's name in the lab.
const Name lab.StoreName = "lease"

// Variant declares the lease store to the registry.
func Variant() variant.Variant {
	return variant.Variant{
		Name:        Name,
		Label:       "lease + fencing token",
		Decides:     "a committed claim with a lease and a rising fencing token; the work runs outside any transaction; the ledger refuses a write whose token is stale",
		Keys:        "PostgreSQL table lease_requests, claimed in its own short transaction, visible while the work runs",
		RequiresKey: true,
		Effects:     "outbox",
		Crash:       variant.CrashLeavesLease,
		Lifetime:    "lease",
		Needs:       []variant.Need{variant.NeedPostgres},
		HowToEnable: "set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test), or install the PostgreSQL server (initdb) for a throwaway cluster",
		Open: func(_ context.Context, d variant.Deps) (lab.Store, error) {
			return New(Config{Pool: d.Postgres, Window: d.Window, Wait: d.Wait, Lease: d.ClaimTTL, Now: d.Clock, Logger: d.Logger})
		},
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries: {Usual: lab.Holds, Holds: "one INSERT … ON CONFLICT commits the claim; the others see it in flight, wait (bounded) and replay the stored response",
				Breaks: "the committed claim did not stop a duplicate"},
			variant.CaseReplicas: {Usual: lab.Holds, Holds: "every replica claims in the same table: one owner, one token across them all",
				Breaks: "the claim did not stop a duplicate across replicas"},
			variant.FaultCase(lab.FaultSlow): {Usual: lab.Holds, Holds: "the slow worker is alive and renews its lease while it works, so nobody takes over: the retries wait, get 202 with the operation's Location, poll it, and replay the one charge (and a take-over, had the lease run out, would be fenced by the ledger)",
				Breaks: "two writes were accepted for one key"},
			variant.FaultCase(lab.FaultCrashAfterClaim): {Usual: lab.Holds, Holds: "the committed claim stayed behind without a charge: retries waited, then one took over with the next token and charged once",
				Breaks: "the abandoned claim let two charges in"},
			variant.FaultCase(lab.FaultCrashAfterCharge): {Usual: lab.Holds, Holds: "charge, event and stored response committed together in phase two: the retry after the lost response replays it",
				Breaks: "the lost response led to a second charge"},
			variant.FaultCase(lab.FaultOutboxFail): {Usual: lab.Holds, Holds: "phase two rolled back whole and the claim's lease was ended: the retry took over and charged once",
				Breaks: "the failed write left a charge behind"},
			variant.FaultCase(lab.FaultAppliedResponseLost): variant.RelayReplaysCapture(),
			variant.FaultCase(lab.FaultStoreRestart): {Usual: lab.Holds, Holds: "the claim is a committed row and nothing is kept in memory or held across phases: the retry replays",
				Breaks: "the restart lost a committed key"},
			variant.FaultCase(lab.FaultExpired): {Usual: lab.Breaks, Holds: "after the window the key is taken over, but the unique (tenant, order_id) constraint refuses a second charge",
				Breaks: "past the retention window the key is new again: without a permanent domain key (order_id) the late retry charges again"},
			variant.FaultCase(lab.FaultStaleWorker): {Usual: lab.Holds, Holds: "the retry took over with the next fencing token and charged; when the paused worker woke, the ledger refused its stale token (recorded in fenced_writes) — and no connection was held during the pause",
				Breaks: "the stale worker's write got past the fence"},
			variant.FaultCase(lab.FaultFailover): {Usual: lab.Holds, Holds: "claim and fencing token live in PostgreSQL: a Redis failover does not touch them",
				Breaks: "a duplicate got in"},
			variant.FaultCase(lab.FaultPGFailover): {Usual: lab.Breaks, UsualWith: variant.ReplicationDecides,
				Holds:  "synchronous replication: the claim's commit waited for the standby and never returned, so nothing of the first attempt was acknowledged; the retry claimed on the new primary and charged once",
				Breaks: "asynchronous replication: the primary alone acknowledged the claim and the charge; the promoted standby never received them, so a retry claimed the key again and charged again, and the relay had already captured the lost charge"},
			variant.CaseReused: {Usual: lab.Holds, Holds: "the committed fingerprint differs: the other amount gets 422 and charges nothing",
				Breaks: "the other amount was charged"},
			variant.CaseTenants: {Usual: lab.Holds, Holds: "the primary key is (tenant, endpoint, key): each tenant is charged once",
				Breaks: "the tenants' keys collided"},
		},
	}
}
