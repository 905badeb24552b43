package experiment

import (
	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

// caseOf names the case a run exercises.
func caseOf(spec Spec, replicas int) variant.Case {
	switch {
	case spec.Scenario == ScenarioReused:
		return variant.CaseReused
	case spec.Scenario == ScenarioTenants:
		return variant.CaseTenants
	case spec.Faults.Point != lab.FaultNone:
		return variant.FaultCase(spec.Faults.Point)
	case replicas > 1:
		return variant.CaseReplicas
	}
	return variant.CaseRetries
}

// expected is the verdict the run's design usually reaches in its case, ""
// when the design does not say.
func (r *Runner) expected(spec Spec, replicas int) lab.Verdict {
	c := caseOf(spec, replicas)
	m, ok := r.Variants.Mechanism(spec.Store, c)
	switch {
	case !ok:
		return ""
	case c == variant.FaultCase(lab.FaultExpired) && spec.OrderID != "":
		// The order id is a constraint of the ledger: it holds whatever store is in front.
		return lab.Holds
	}
	return m.Expected(spec.Faults)
}

// explain returns the mechanism behind a run's verdict, saying so when the
// run did not end the way its design usually does.
func (r *Runner) explain(spec Spec, replicas int, verdict lab.Verdict) string {
	if verdict == lab.Inconclusive {
		return "the attempts did not all get an answer a client can act on (see the timeline), so this run says nothing about the store"
	}
	m, ok := r.Variants.Mechanism(spec.Store, caseOf(spec, replicas))
	if !ok {
		return ""
	}
	text := m.Holds
	if verdict == lab.Breaks {
		text = m.Breaks
	}
	if usual := r.expected(spec, replicas); verdict != usual {
		text = "Unexpectedly " + string(verdict) + ": " + text
	}
	return text
}
