// Package conformance_test checks every registered idempotency design
// against what it declares: a table of scenarios run in-process on every
// backend (conformance_test.go), and a property-based state machine that
// interleaves charges, retries, twins, crashes, restarts and clock jumps
// against a small model of each design (machine_test.go).
package conformance_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idempotency-lab/lab/lab/labtest"
)

// rapidChecks bounds the state machine: every check of a real backend costs
// real round trips, and rapid's default (100 checks) would take minutes
// under -race. -rapid.checks or RAPID_CHECKS still overrides it.
const rapidChecks = 15

func TestMain(m *testing.M) {
	flag.Parse()
	if err := boundRapid(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	goleak.VerifyTestMain(labtest.WithServices(m))
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
	return flag.Set("rapid.checks", fmt.Sprint(rapidChecks))
}
