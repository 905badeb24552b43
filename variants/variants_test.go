package variants_test

import (
	"slices"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants"
)

// TestBuiltinIsTheLesson: the built-in designs register, in the lesson's
// order: no key, the key looked up before acting (the race), then the
// claims that close it, from one replica to many.
func TestBuiltinIsTheLesson(t *testing.T) {
	r, err := variant.NewRegistry(variants.Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	want := []lab.StoreName{"unsafe", "look-first", "memory", "redis", "postgres", "lease", "phases", "redis+postgres"}
	if got := r.Names(); !slices.Equal(got, want) {
		t.Fatalf("built-in designs %v, want %v", got, want)
	}
	for _, v := range r.All() {
		if v.Label == "" || v.Decides == "" || v.Keys == "" {
			t.Errorf("%s: says nothing of itself: label %q, decides %q, keys %q", v.Name, v.Label, v.Decides, v.Keys)
		}
		if len(v.Needs) > 0 && v.HowToEnable == "" {
			t.Errorf("%s needs %v and does not say how to enable it", v.Name, v.Needs)
		}
	}
}

// TestBuiltinExplainsEveryCase: every built-in design explains its usual
// verdict in every case the matrix runs, so no cell of the README's table
// goes without its reason.
func TestBuiltinExplainsEveryCase(t *testing.T) {
	r, err := variant.NewRegistry(variants.Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.All() {
		for _, c := range experiment.Cases() {
			if c.NeedsPGPair && !slices.Contains(v.Needs, variant.NeedPostgres) {
				continue // n/a in the matrix: no key of it is in PostgreSQL to lose
			}
			vc := variant.Case(c.Name)
			switch {
			case c.Scenario == experiment.ScenarioReused:
				vc = variant.CaseReused
			case c.Scenario == experiment.ScenarioTenants:
				vc = variant.CaseTenants
			case c.Faults.Point != lab.FaultNone:
				vc = variant.FaultCase(c.Faults.Point)
			}
			m, ok := v.Mechanisms[vc]
			if !ok {
				t.Errorf("%s explains nothing of %s (case %s)", v.Name, c.Name, vc)
				continue
			}
			why := m.Holds
			if m.Expected(c.Faults) == lab.Breaks {
				why = m.Breaks
			}
			if why == "" {
				t.Errorf("%s, %s: usually %s, with no reason why", v.Name, c.Name, m.Expected(c.Faults))
			}
		}
	}
}
