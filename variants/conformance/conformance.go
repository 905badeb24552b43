// Package conformance checks an idempotency design against what it
// declares. Every keyed design's package calls it from one test:
//
//	func TestConformance(t *testing.T) { conformance.Exercise(t, memory.Variant()) }
//
// Exercise runs, in-process and on every backend the design needs, a table
// of scenarios (scenarios.go) and a property-based state machine that
// interleaves charges, retries, twins, crashes, restarts and clock jumps
// against a small model of the design (machine.go), built from its
// declaration: its usual verdicts and its crash effect.
package conformance

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idempotency-lab/lab/lab/variant"
)

// rapidChecks bounds the state machine: every check of a real backend costs
// real round trips, and rapid's default (100 checks) would take minutes
// under -race. -rapid.checks or RAPID_CHECKS still overrides it.
const rapidChecks = 15

// Exercise runs the suite on v, a design that requires a key: subtests
// memory/…, redis-embedded/…, redis-real/…, postgres/… (named after the
// design and, for Redis, the server), each a scenario or the StateMachine.
// Each owns its store, schema and key prefix, so they all run in parallel.
// Call it from a test of its own, not a parallel one: it sets rapid's
// number of checks for the process, and at the end it checks that the
// design left no goroutine behind.
func Exercise(t *testing.T, v variant.Variant) {
	t.Helper()
	if !v.RequiresKey {
		t.Fatalf("%s ignores the key: the suite checks designs that decide by it", v.Name)
	}
	if err := boundRapid(); err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	for _, b := range backends(v) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, sc := range scenarios() {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					wait := sc.wait
					if wait == 0 {
						wait = defaultWait
					}
					e := startServices(t, b).open(t, settings{window: window, wait: wait, claimTTL: claimTTL})
					sc.run(t, e)
				})
			}
			t.Run("StateMachine", func(t *testing.T) {
				t.Parallel()
				stateMachine(t, b)
			})
		})
	}
}

// boundRapid lowers rapid's number of checks unless the caller chose one.
func boundRapid() error {
	if _, ok := os.LookupEnv("RAPID_CHECKS"); ok {
		return nil
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if set {
		return nil
	}
	if err := flag.Set("rapid.checks", fmt.Sprint(rapidChecks)); err != nil {
		return fmt.Errorf("error bounding rapid's checks: %w", err)
	}
	return nil
}
