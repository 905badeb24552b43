// Package signature signs and verifies webhook bodies the way payment
// providers do: an HMAC-SHA256 over the timestamp and the body, sent in one
// header, so a receiver can tell a genuine event from a forged, altered or
// replayed one.
package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// Header carries the signature of a webhook.
const Header = "Provider-Signature"

// Verification errors.
var (
	ErrMissing   = errors.New("signature header missing")
	ErrMalformed = errors.New("signature header malformed")
	ErrTooOld    = errors.New("signature timestamp outside the tolerance")
	ErrMismatch  = errors.New("signature does not match the body")
)

// maxHeader bounds the work a hostile header can cause.
const maxHeader = 4096

// Sign returns the header value for body sent at t:
// t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<unix seconds>." + body)>.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verify checks that header signs body with secret and that its timestamp
// is within tolerance of now, either way. Several v1 signatures may be
// given (a provider rolling its secret sends one per secret); one match is
// enough. Items of other schemes are ignored.
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	if header == "" {
		return ErrMissing
	}
	if len(header) > maxHeader {
		return ErrMalformed
	}
	var (
		ts   string
		sigs [][]byte
	)
	for item := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return ErrMalformed
		}
		switch k {
		case "t":
			if ts != "" || !digits(v) {
				return ErrMalformed
			}
			ts = v
		case "v1":
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				return ErrMalformed
			}
			sigs = append(sigs, sig)
		}
	}
	if ts == "" || len(sigs) == 0 {
		return ErrMalformed
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return ErrMalformed
	}
	// Sub saturates, so a timestamp far away cannot wrap around into range.
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return ErrTooOld
	}
	want := mac(secret, ts, body)
	for _, sig := range sigs {
		if hmac.Equal(sig, want) {
			return nil
		}
	}
	return ErrMismatch
}

// digits accepts 1..19 ASCII digits: a non-negative int64, no sign.
func digits(s string) bool {
	if s == "" || len(s) > 19 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
