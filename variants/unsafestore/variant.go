package unsafestore

import (
	"context"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Variant declares the unsafe store to the registry.
func Variant() variant.Variant {
	return variant.Variant{
		Name:        Name,
		Label:       "no key",
		Decides:     "it doesn't: every request is a new charge",
		Keys:        "nowhere: the key is ignored",
		RequiresKey: false,
		Effects:     "direct",
		Crash:       variant.CrashNothingToLose,
		Open: func(_ context.Context, d variant.Deps) (lab.Store, error) {
			return New(books{d.Ledger, d.Sender}, d.Clock, d.Logger)
		},
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries:  {Usual: lab.Breaks, Holds: "only one attempt reached the server", Breaks: "no key is checked: every attempt is a new charge"},
			variant.CaseReplicas: {Usual: lab.Breaks, Holds: "only one attempt reached the servers", Breaks: "no key is checked on any replica: every attempt is a new charge"},
			variant.FaultCase(lab.FaultSlow): {Usual: lab.Breaks, Holds: "only one attempt reached the server",
				Breaks: "no key is checked, so slowness changes nothing: every attempt charges"},
			variant.FaultCase(lab.FaultCrashAfterClaim): {Usual: lab.Breaks, Holds: "the crash came before the charge and only one retry followed",
				Breaks: "nothing was claimed; the crashed attempt charged nothing, but every retry charges"},
			variant.FaultCase(lab.FaultCrashAfterCharge): {Usual: lab.Breaks, Holds: "only one attempt reached the server",
				Breaks: "the lost response leaves a charge the client cannot see; its retries charge again"},
			variant.FaultCase(lab.FaultOutboxFail): {Usual: lab.Breaks, Holds: "only one attempt reached the server",
				Breaks: "the provider is called inline, before the write that then fails: it captured and receipted a charge the ledger rolled back, and every retry charges (and sends) again"},
			variant.FaultCase(lab.FaultAppliedResponseLost): {Usual: lab.Breaks, Holds: "only one attempt reached the server",
				Breaks: "the provider applied the inline capture and its answer was lost; the charge went on, and every retry, with no key to stop it, charged and captured again under a key of its own"},
			variant.FaultCase(lab.FaultStoreRestart): {Usual: lab.Breaks, Holds: "only one attempt reached the server",
				Breaks: "there is no state to lose: every retry charges anyway"},
			variant.FaultCase(lab.FaultExpired): {Usual: lab.Breaks, Holds: "the order id's unique constraint in the ledger refused the second charge",
				Breaks: "no key is checked: the late retry charges like every other"},
			variant.FaultCase(lab.FaultStaleWorker): {Usual: lab.Breaks, Holds: "only one attempt reached the server",
				Breaks: "nothing is claimed, so nothing can expire: the retry charges, and the paused worker charges too when it wakes"},
			variant.FaultCase(lab.FaultFailover): {Usual: lab.Breaks, Holds: "only one attempt reached the server",
				Breaks: "nothing is stored anywhere: every retry charges, failover or not"},
			variant.CaseReused:  {Usual: lab.Breaks, Holds: "only the first attempt could charge", Breaks: "the key is ignored, so another amount under the same key is simply another charge"},
			variant.CaseTenants: {Usual: lab.Breaks, Holds: "each tenant was charged once", Breaks: "no key is checked: each tenant's attempts all charge"},
		},
	}
}

// books joins the ledger and the direct sender the assembly hands over.
type books struct {
	lab.Ledger
	lab.DirectSender
}
