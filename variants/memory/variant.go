package memory

import (
	"context"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Name is the variant's name in the lab.
const Name lab.StoreName = "memory"

// Variant declares the memory store to the registry.
func Variant() variant.Variant {
	return variant.Variant{
		Name:        Name,
		Label:       "map in the heap",
		Decides:     "a map in the process heap, claimed under a mutex",
		Keys:        "a map in this replica's heap, claimed under a mutex",
		RequiresKey: true,
		Effects:     "outbox",
		Crash:       variant.CrashWipesHeap,
		Open: func(_ context.Context, d variant.Deps) (lab.Store, error) {
			s, err := New(Config{Ledger: d.Ledger, Window: d.Window, Wait: d.Wait, Now: d.Clock})
			if err != nil {
				return nil, err // no nil *Store inside a non-nil lab.Store
			}
			return s, nil
		},
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries: {Usual: lab.Holds, Holds: "one replica, one map: the mutex lets one attempt claim the key; the others wait for its response and replay it",
				Breaks: "the map did not stop a duplicate on one replica"},
			variant.CaseReplicas: {Usual: lab.Breaks, Holds: "every attempt reached the same map",
				Breaks: "each replica has its own map in its own heap: each one lets its first attempt charge, one charge per replica"},
			variant.FaultCase(lab.FaultSlow): {Usual: lab.Holds, Holds: "the claim lives as long as the work: twins wait on the in-flight entry and replay it, or get 409 after the bounded wait",
				Breaks: "slowness let a twin in"},
			variant.FaultCase(lab.FaultCrashAfterClaim): {Usual: lab.Holds, Holds: "the crash lost the map with the claim, but nothing was charged: the retry charges once",
				Breaks: "the crash lost the claim and more than one retry charged"},
			variant.FaultCase(lab.FaultCrashAfterCharge): {Usual: lab.Breaks, Holds: "the key survived the crash",
				Breaks: "the crash wiped the process heap after the charge: the map no longer knows the key, so the retry charges again"},
			variant.FaultCase(lab.FaultOutboxFail): {Usual: lab.Holds, Holds: "the ledger refused the charge with its event, the claim was released, and the retry charged once",
				Breaks: "the failed write left a charge behind"},
			variant.FaultCase(lab.FaultAppliedResponseLost): variant.RelayReplaysCapture(),
			variant.FaultCase(lab.FaultStoreRestart): {Usual: lab.Breaks, Holds: "the key survived the restart",
				Breaks: "a restart forgets every key in the heap: the retry of a completed charge charges again"},
			variant.FaultCase(lab.FaultExpired): {Usual: lab.Breaks, Holds: "the order id's unique constraint in the ledger refused the second charge",
				Breaks: "the key was evicted after its window: the late retry is a new operation"},
			variant.FaultCase(lab.FaultStaleWorker): {Usual: lab.Holds, Holds: "the in-process claim has no lifetime to outlive: the retry waited on the paused worker's entry (bounded) and replayed it",
				Breaks: "the retry got past the paused worker's claim"},
			variant.FaultCase(lab.FaultFailover): {Usual: lab.Holds, Holds: "the keys live in this process, not in Redis: the failover changed nothing",
				Breaks: "a duplicate got in"},
			variant.CaseReused: {Usual: lab.Holds, Holds: "the stored fingerprint differs: the other amount gets 422 and charges nothing",
				Breaks: "the other amount was charged"},
			variant.CaseTenants: {Usual: lab.Holds, Holds: "keys are scoped by (tenant, endpoint, key): each tenant is charged once and sees only its own response",
				Breaks: "the tenants' keys collided"},
		},
	}
}
