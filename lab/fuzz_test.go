package lab_test

import (
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// FuzzParseFaults holds the Lab-Fault header to the rule the request
// parsers' targets (in lab/api/wire) hold too: every input is either
// valid, and then within its bounds and stable under re-encoding, or
// refused with an *InvalidError naming a parameter; never a panic, never
// another error. Seeds live in testdata/fuzz/FuzzParseFaults/ as well as
// in f.Add. A bounded run:
//
//	go test -run '^$' -fuzz '^FuzzParseFaults$' -fuzztime 20s ./lab/

func FuzzParseFaults(f *testing.F) {
	for _, s := range []string{"", "slow; work_ms=300; ttl_ms=100", "slow", "meteor", "slow; work_ms=0", "crash_after_claim; x=1",
		"expired; window_ms=200", "outbox_fail", "store_restart;", ";;", "ttl_ms=60000", "ttl_ms=60001", "work_ms=+5",
		"work_ms= 5", "slow; slow; work_ms=1", "=5", "work_ms", "\x00", "\xff; ttl_ms=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		fs, err := lab.ParseFaults(h)
		if err != nil {
			labtest.WantInvalid(t, err, lab.FaultHeader)
			return
		}
		if fs.Point != lab.FaultNone {
			if _, err := lab.ParseFaultPoint("fault", string(fs.Point)); err != nil {
				t.Fatalf("unknown point %q accepted", fs.Point)
			}
		}
		for _, d := range []time.Duration{fs.Work, fs.ClaimTTL, fs.Retention} {
			if d != 0 && (d < time.Millisecond || d > time.Minute || d%time.Millisecond != 0) {
				t.Fatalf("duration %s out of bounds", d)
			}
		}
		if fs.Point == lab.FaultSlow && fs.Work == 0 {
			t.Fatalf("slow without work accepted")
		}
		again, err := lab.ParseFaults(fs.String())
		if err != nil || again != fs {
			t.Fatalf("%q parses to %+v, then %q to %+v, %v", h, fs, fs.String(), again, err)
		}
	})
}
