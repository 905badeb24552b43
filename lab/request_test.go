package lab_test

import (
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
)

func TestFingerprintIgnoresOrderAndDefaults(t *testing.T) {
	a, err := lab.ParseChargeRequest(strings.NewReader(`{"account":"a","amount_cents":5,"currency":"USD"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := lab.ParseChargeRequest(strings.NewReader(" {\n\"amount_cents\": 5, \"account\": \"a\", \"currency\":\"usd\"}"))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := lab.ParseChargeRequest(strings.NewReader(`{"account":"a","amount_cents":6}`))
	if a.Fingerprint() != b.Fingerprint() {
		t.Fatal("same request, different fingerprints")
	}
	if a.Fingerprint() == c.Fingerprint() {
		t.Fatal("different amounts, same fingerprint")
	}
	d, _ := lab.ParseChargeRequest(strings.NewReader(`{"account":"a","amount_cents":5,"order_id":"o-1"}`))
	if a.Fingerprint() == d.Fingerprint() {
		t.Fatal("order id not in the fingerprint")
	}
}

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
	for _, bad := range []string{"meteor", "slow", "slow; work_ms=0", "crash_after_claim; x=1"} {
		if _, err := lab.ParseFaults(bad); err == nil {
			t.Errorf("ParseFaults(%q) accepted", bad)
		}
	}
}
