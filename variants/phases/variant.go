package phases

import (
	"context"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Name is the variant's name in the lab.
const Name lab.StoreName = "phases"

// DefaultCompleteAfter is how long past its lock a key short of finished
// waits for its client before the completer finishes it.
const DefaultCompleteAfter = 2 * time.Second

// Variant declares the phases store to the registry.
func Variant() variant.Variant {
	return variant.Variant{
		Name:        Name,
		Label:       "atomic phases + completer",
		Decides:     "phase one commits the claim with the request; each later phase commits its writes with the key's recovery point, and a retry resumes from there instead of starting over",
		Keys:        "PostgreSQL table phase_requests: the request, its recovery point and a lock token every phase checks",
		RequiresKey: true,
		Effects:     "outbox",
		Crash:       variant.CrashLeavesRecoveryPoint,
		Lifetime:    "lock",
		Needs:       []variant.Need{variant.NeedPostgres},
		HowToEnable: "set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/test), or install the PostgreSQL server (initdb) for a throwaway cluster",
		Open: func(_ context.Context, d variant.Deps) (lab.Store, error) {
			return New(Config{Pool: d.Postgres, Provider: d.Capturer, Window: d.Window, Lock: d.ClaimTTL, CompleteAfter: DefaultCompleteAfter,
				Now: d.Clock, Logger: d.Logger})
		},
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries: {Usual: lab.Holds, Holds: "one INSERT … ON CONFLICT commits the claim; the twins find the key locked, get 409 with Retry-After, and replay once it is finished",
				Breaks: "the committed claim did not stop a duplicate"},
			variant.CaseReplicas: {Usual: lab.Holds, Holds: "every replica claims in the same table: one owner across them all",
				Breaks: "the claim did not stop a duplicate across replicas"},
			variant.FaultCase(lab.FaultSlow): {Usual: lab.Holds, Holds: "while the work runs the key is locked and the twins get 409; if the lock ends first, a retry takes the key over with the next token and the slow worker's phase is refused by it — both write under one charge id, so the ledger holds one charge",
				Breaks: "two charges for one key"},
			variant.FaultCase(lab.FaultCrashAfterClaim): {Usual: lab.Holds, Holds: "phase one committed the claim and the request and nothing else: once the lock ended a retry took the key over and ran phases two to four, charging once",
				Breaks: "the claim left behind let two charges in"},
			variant.FaultCase(lab.FaultCrashAfterCharge): {Usual: lab.Holds, Holds: "all four phases had committed, the response with them: the retry after the lost response replays it",
				Breaks: "the lost response led to a second charge"},
			variant.FaultCase(lab.FaultOutboxFail): {Usual: lab.Holds, Holds: "phase four (the receipt event) rolled back alone; charge and capture had committed with their recovery points, and the lock was let go: the retry resumed at phase four and finished with the one charge",
				Breaks: "the failed write led to a second charge"},
			variant.FaultCase(lab.FaultCrashAfterPhase): {Usual: lab.Holds, Holds: "every phase that ran committed with its recovery point: once the lock ended, the retry (or the completer, had the client not come back) resumed from there — after phase one it charged, after phase two it captured under the charge's derived key, after phase three it only finished — so one charge and one capture",
				Breaks: "resuming from the recovery point charged or captured twice"},
			variant.FaultCase(lab.FaultAppliedResponseLost): {Usual: lab.Holds, Holds: "the provider applied the capture but its answer was lost, so the key stayed at charge_created with its lock let go; the retry resumed at phase three and captured again under the same derived key, which the provider replayed: one charge, one capture",
				Breaks: "the lost answer led to a second charge or capture"},
			variant.FaultCase(lab.FaultStoreRestart): {Usual: lab.Holds, Holds: "the key and its recovery point are committed rows: the retry replays",
				Breaks: "the restart lost a committed key"},
			variant.FaultCase(lab.FaultExpired): {Usual: lab.Breaks, Holds: "after the window the key is taken over, but the unique (tenant, order_id) constraint refuses a second charge",
				Breaks: "past the retention window the key is new again: without a permanent domain key (order_id) the late retry charges again"},
			variant.FaultCase(lab.FaultStaleWorker): {Usual: lab.Holds, Holds: "the retry took the key over with the next token once the lock ended and finished it; when the paused worker woke, its phase found the token changed and committed nothing (recorded in fenced_writes), and its charge would have had the same id anyway",
				Breaks: "the stale worker's phase got past the lock"},
			variant.FaultCase(lab.FaultFailover): {Usual: lab.Holds, Holds: "the key and its recovery point live in PostgreSQL: a Redis failover does not touch them",
				Breaks: "a duplicate got in"},
			variant.FaultCase(lab.FaultPGFailover): {Usual: lab.Breaks, UsualWith: variant.ReplicationDecides,
				Holds:  "synchronous replication: phase one's commit waited for the standby and never returned, so nothing was charged or captured; the retry claimed on the new primary and ran every phase once",
				Breaks: "asynchronous replication: the primary alone acknowledged the phases, the capture included; the promoted standby never had the key, so the retry claimed it again, charged again under a new charge id and captured again"},
			variant.CaseReused: {Usual: lab.Holds, Holds: "the recorded fingerprint differs: the other amount gets 422 and charges nothing",
				Breaks: "the other amount was charged"},
			variant.CaseTenants: {Usual: lab.Holds, Holds: "the primary key is (tenant, endpoint, key): each tenant is charged once",
				Breaks: "the tenants' keys collided"},
		},
	}
}
