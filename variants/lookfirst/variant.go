package lookfirst

import (
	"context"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Variant declares the look-first store to the registry. Its verdicts are
// certain, not usual: Window makes attempts released together overlap, and
// every case that releases two or more of them at once breaks.
func Variant() variant.Variant {
	return variant.Variant{
		Name:        Name,
		Label:       "look, then charge",
		Decides:     "looks the key up and charges when it finds nothing: check, then act, in two steps",
		Keys:        "a map in this replica's heap, read before the charge and written after it",
		RequiresKey: true,
		Effects:     "outbox",
		Crash:       variant.CrashWipesHeap,
		Open: func(_ context.Context, d variant.Deps) (lab.Store, error) {
			return New(d.Ledger, d.Clock, d.Window)
		},
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries: {Usual: lab.Breaks, Holds: "the attempts did not overlap: each looked after the one before had written",
				Breaks: "every attempt looked before any had written: each found nothing and charged — the check and the act are two steps, and nothing marks the key taken between them"},
			variant.CaseReplicas: {Usual: lab.Breaks, Holds: "the attempts did not overlap, and each reached the replica that had written the key",
				Breaks: "every attempt looked before any had written, on replicas that each have their own map: each one charged"},
			variant.FaultCase(lab.FaultSlow): {Usual: lab.Breaks, Holds: "the attempts did not overlap",
				Breaks: "slow or not, nothing is claimed: the attempts released together all looked before any wrote, and each charged"},
			variant.FaultCase(lab.FaultCrashAfterClaim): {Usual: lab.Breaks, Holds: "the retries came one at a time: the crash charged nothing, and the first retry's answer was there for the next",
				Breaks: "the crash came before the charge and left nothing, but the retries released together raced each other: each looked, found nothing and charged"},
			variant.FaultCase(lab.FaultCrashAfterCharge): {Usual: lab.Breaks, Holds: "the key survived the crash",
				Breaks: "the crash came between the charge and the write: the key was never recorded (and the heap died anyway), so every retry charged again"},
			variant.FaultCase(lab.FaultOutboxFail): {Usual: lab.Breaks, Holds: "the retries came one at a time: the failed write charged nothing, and the first retry's answer was there for the next",
				Breaks: "the ledger refused the charge with its event and nothing was recorded; the retries released together then raced each other, and each charged"},
			variant.FaultCase(lab.FaultAppliedResponseLost): variant.RelayReplaysCapture(),
			variant.FaultCase(lab.FaultStoreRestart): {Usual: lab.Breaks, Holds: "the key survived the restart",
				Breaks: "a restart forgets the map in the heap: the retries found nothing and, released together, each charged"},
			variant.FaultCase(lab.FaultExpired): {Usual: lab.Breaks, Holds: "the order id's unique constraint in the ledger refused the second charge",
				Breaks: "the key was forgotten after its retention window: the late retry is a new operation"},
			variant.FaultCase(lab.FaultStaleWorker): {Usual: lab.Breaks, Holds: "the retries came after the paused worker had written",
				Breaks: "nothing is claimed, so the paused worker held nothing: the retries looked, found nothing and charged, and the worker charged too when it woke"},
			variant.FaultCase(lab.FaultFailover): {Usual: lab.Holds, Holds: "the keys live in this process, not in Redis: the failover changed nothing, and the retries, sent after the first attempt's answer, found it",
				Breaks: "a duplicate got in"},
			variant.CaseReused: {Usual: lab.Holds, Holds: "the first request was written before the others came: they found its fingerprint, which differs, and got 422",
				Breaks: "the other amount was charged"},
			variant.CaseTenants: {Usual: lab.Breaks, Holds: "each tenant's attempts did not overlap",
				Breaks: "keys are scoped by tenant, but the second tenant's attempts, released together, raced each other: both looked before either wrote, and both charged"},
		},
	}
}
