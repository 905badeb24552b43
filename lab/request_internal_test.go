package lab

import "testing"

// TestFingerprintIsStable pins one fingerprint: keys stored by an earlier
// version must still match their retries, so the hashed text never changes.
func TestFingerprintIsStable(t *testing.T) {
	r := ChargeRequest{Account: "acct-1", AmountCents: 2500, Currency: "USD", OrderID: "ord-\"1\"\n"}
	if got, want := r.Fingerprint(), "44514d6d2550a1241ab0cc5b949eddf88d8af570654581dee50d3db5d424ca74"; got != want {
		t.Fatalf("fingerprint %s, stored keys carry %s", got, want)
	}
}

// BenchmarkFingerprint hashes a typical request, as every keyed charge does.
func BenchmarkFingerprint(b *testing.B) {
	req := ChargeRequest{Account: "acct-1", AmountCents: 2500, Currency: "USD"}
	b.ReportAllocs()
	for b.Loop() {
		if fp := req.Fingerprint(); len(fp) != 64 {
			b.Fatalf("fingerprint %q", fp)
		}
	}
}
