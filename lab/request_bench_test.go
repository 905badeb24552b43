package lab

import (
	"strings"
	"testing"
)

// typicalBody is a charge body as clients send it.
const typicalBody = `{"account":"acct-1","amount_cents":2500,"currency":"USD"}`

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

// BenchmarkParseChargeRequest decodes and validates a typical body. The
// reader is reset, not rebuilt, so only the parse is counted.
func BenchmarkParseChargeRequest(b *testing.B) {
	body := strings.NewReader(typicalBody)
	b.ReportAllocs()
	for b.Loop() {
		body.Reset(typicalBody)
		if req, err := ParseChargeRequest(body); err != nil || req.AmountCents != 2500 {
			b.Fatalf("%+v, %v", req, err)
		}
	}
}
