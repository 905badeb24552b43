package signature_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/signature"
)

var (
	secret = []byte("whsec_test")
	signed = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	body   = []byte(`{"event_id":"evt_1","type":"capture.succeeded"}`)
)

// wantHex is the signature of body at signed, computed outside Go:
// printf '%s' '1793534400.{"event_id":"evt_1","type":"capture.succeeded"}' | openssl dgst -sha256 -hmac whsec_test
const wantHex = "25da289eb6b1bb8c7e0d9fba54c6e3f808b8fdfcc730512771849e37847a5eec"

func TestSignFormat(t *testing.T) {
	got := signature.Sign(secret, signed, body)
	want := "t=1793534400,v1=" + wantHex
	if got != want {
		t.Fatalf("Sign = %q, want %q", got, want)
	}
}

func TestVerify(t *testing.T) {
	good := signature.Sign(secret, signed, body)
	other := signature.Sign([]byte("another secret"), signed, body)
	v1 := func(h string) string { _, v, _ := strings.Cut(h, ",v1="); return v }
	tests := []struct {
		name   string
		header string
		body   []byte
		secret []byte
		now    time.Time
		want   error
	}{
		{"OK", good, body, secret, signed, nil},
		{"OKWithinTolerance", good, body, secret, signed.Add(4 * time.Minute), nil},
		{"OKClockBehind", good, body, secret, signed.Add(-4 * time.Minute), nil},
		{"OKSpaces", "t=1793534400, v1=" + v1(good), body, secret, signed, nil},
		{"OKOneOfSeveral", good + ",v1=" + v1(other), body, secret, signed, nil},
		{"OKRolledSecret", other + ",v1=" + v1(good), body, secret, signed, nil},
		{"OKOtherSchemeIgnored", good + ",v0=abc", body, secret, signed, nil},
		{"ErrMissing", "", body, secret, signed, signature.ErrMissing},
		{"ErrTamperedBody", good, []byte(`{"event_id":"evt_1","type":"capture.failed"}`), secret, signed, signature.ErrMismatch},
		{"ErrWrongSecret", good, body, []byte("wrong"), signed, signature.ErrMismatch},
		{"ErrSignedWithOtherSecret", other, body, secret, signed, signature.ErrMismatch},
		{"ErrEmptyBodySwap", good, nil, secret, signed, signature.ErrMismatch},
		{"ErrTimestampChanged", "t=1793534401,v1=" + v1(good), body, secret, signed, signature.ErrMismatch},
		{"ErrTooOld", good, body, secret, signed.Add(6 * time.Minute), signature.ErrTooOld},
		{"ErrTooNew", good, body, secret, signed.Add(-6 * time.Minute), signature.ErrTooOld},
		{"ErrFarFuture", "t=9223372036854775807,v1=" + v1(good), body, secret, signed, signature.ErrTooOld},
		{"ErrZero", "t=0,v1=" + v1(good), body, secret, signed, signature.ErrTooOld},
		{"ErrNoTimestamp", "v1=" + v1(good), body, secret, signed, signature.ErrMalformed},
		{"ErrNoSignature", "t=1793534400", body, secret, signed, signature.ErrMalformed},
		{"ErrTwoTimestamps", "t=1793534400,t=1793534400,v1=" + v1(good), body, secret, signed, signature.ErrMalformed},
		{"ErrSignedTimestamp", "t=+1793534400,v1=" + v1(good), body, secret, signed, signature.ErrMalformed},
		{"ErrNegativeTimestamp", "t=-1,v1=" + v1(good), body, secret, signed, signature.ErrMalformed},
		{"ErrTimestampOverflow", "t=99999999999999999999,v1=" + v1(good), body, secret, signed, signature.ErrMalformed},
		{"ErrNotHex", "t=1793534400,v1=zz", body, secret, signed, signature.ErrMalformed},
		{"ErrShortSignature", "t=1793534400,v1=abcd", body, secret, signed, signature.ErrMalformed},
		{"ErrUpperCaseKey", "T=1793534400,V1=" + v1(good), body, secret, signed, signature.ErrMalformed},
		{"ErrNoEquals", "t1793534400,v1=" + v1(good), body, secret, signed, signature.ErrMalformed},
		{"ErrGarbage", "garbage", body, secret, signed, signature.ErrMalformed},
		{"ErrHuge", good + strings.Repeat(",x=y", 2000), body, secret, signed, signature.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := signature.Verify(tt.secret, tt.header, tt.body, tt.now, 5*time.Minute)
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("Verify(%q) = %v, want %v", tt.header, err, tt.want)
			}
		})
	}
}

func FuzzVerify(f *testing.F) {
	good := signature.Sign(secret, signed, body)
	f.Add(good, body, int64(0))
	f.Add("t=1,v1=", []byte{}, int64(1))
	f.Add("t=,v1=00,,=", []byte("x"), int64(-1))
	f.Add(",,,", []byte(nil), int64(300))
	f.Fuzz(func(t *testing.T, header string, b []byte, offset int64) {
		now := signed.Add(time.Duration(offset) * time.Second)
		err := signature.Verify(secret, header, b, now, 5*time.Minute)
		switch {
		case err == nil, errors.Is(err, signature.ErrMissing), errors.Is(err, signature.ErrMalformed),
			errors.Is(err, signature.ErrTooOld), errors.Is(err, signature.ErrMismatch):
		default:
			t.Fatalf("Verify returned an unknown error: %v", err)
		}
		// Whatever the body, its own signature verifies.
		if err := signature.Verify(secret, signature.Sign(secret, now, b), b, now, 0); err != nil {
			t.Fatalf("a fresh signature of %q does not verify: %v", b, err)
		}
	})
}
