package lab_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

func TestValidateKey(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{{"order-4711", true}, {"", false}, {strings.Repeat("k", 255), true}, {strings.Repeat("k", 256), false}, {"a\nb", false}, {"a\x7fb", false}, {"\xff", false}} {
		if err := lab.ValidateKey(tc.key); (err == nil) != tc.ok {
			t.Errorf("ValidateKey(%q) = %v", tc.key, err)
		}
	}
}

func TestParseFaults(t *testing.T) {
	f, err := lab.ParseFaults("slow; work_ms=300; ttl_ms=100")
	if err != nil || f.Point != lab.FaultSlow || f.Work.Milliseconds() != 300 || f.ClaimTTL.Milliseconds() != 100 {
		t.Fatalf("%+v %v", f, err)
	}
	for _, bad := range []string{"meteor", "slow", "slow; work_ms=0", "crash_after_claim; x=1", "slow; work_ms=+300",
		"slow; work_ms=0300", "slow; work_ms= 300", "slow; expired; work_ms=5", "slow; work_ms=1; work_ms=2", "\xd7=1"} {
		if _, err := lab.ParseFaults(bad); err == nil {
			t.Errorf("ParseFaults(%q) accepted", bad)
		}
	}
}

func TestFaultsRoundTripJSON(t *testing.T) {
	for _, f := range []lab.Faults{{}, {Point: lab.FaultSlow, Work: 300 * time.Millisecond, ClaimTTL: 100 * time.Millisecond},
		{Point: lab.FaultExpired, Retention: 200 * time.Millisecond}, {Point: lab.FaultStoreRestart}} {
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		var back lab.Faults
		if err := json.Unmarshal(b, &back); err != nil || back != f {
			t.Fatalf("%s read back as %+v (%v)", b, back, err)
		}
	}
}
