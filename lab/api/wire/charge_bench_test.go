package wire

import (
	"strings"
	"testing"
)

// typicalBody is a charge body as clients send it.
const typicalBody = `{"account":"acct-1","amount_cents":2500,"currency":"USD"}`

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
