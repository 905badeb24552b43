package lab

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits of the charge API.
const (
	MaxKeyBytes     = 255
	MaxAccountBytes = 64
	MaxOrderIDBytes = 64
	MaxAmountCents  = 10_000_000
	APIVersion      = "2026-11-01"
	DefaultCurrency = "USD"
)

// ChargeRequest is the validated business content of POST /charges.
type ChargeRequest struct {
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	OrderID     string `json:"order_id,omitempty"`
}

// InvalidError names the parameter that is wrong and what it accepts.
type InvalidError struct {
	Param  string
	Reason string
}

func (e *InvalidError) Error() string { return e.Param + ": " + e.Reason }

// Invalid builds an *InvalidError.
func Invalid(param, format string, args ...any) error {
	return &InvalidError{Param: param, Reason: fmt.Sprintf(format, args...)}
}

// ParseChargeRequest decodes and validates a JSON body strictly: unknown
// fields, wrong types, fractions and overflow are rejected.
func ParseChargeRequest(body io.Reader) (ChargeRequest, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(io.LimitReader(body, 64<<10))
	if err := dec.Decode(&raw); err != nil {
		return ChargeRequest{}, Invalid("body", "must be a JSON object: %v", err)
	}
	if dec.More() {
		return ChargeRequest{}, Invalid("body", "must hold exactly one JSON object")
	}
	if raw == nil {
		return ChargeRequest{}, Invalid("body", "must be a JSON object")
	}
	var r ChargeRequest
	for name, value := range raw {
		var err error
		switch name {
		case "account":
			r.Account, err = jsonString(name, value)
		case "currency":
			r.Currency, err = jsonString(name, value)
		case "order_id":
			r.OrderID, err = jsonString(name, value)
		case "amount_cents":
			r.AmountCents, err = jsonAmount(value)
		default:
			err = Invalid(name, "unknown field; allowed: account, amount_cents, currency, order_id")
		}
		if err != nil {
			return ChargeRequest{}, err
		}
	}
	if _, ok := raw["amount_cents"]; !ok {
		return ChargeRequest{}, Invalid("amount_cents", "is required: an integer number of cents in 1..%d", MaxAmountCents)
	}
	return r.Normalize()
}

// Normalize applies defaults and validates every field.
func (r ChargeRequest) Normalize() (ChargeRequest, error) {
	if r.Currency == "" {
		r.Currency = DefaultCurrency
	}
	r.Currency = strings.ToUpper(r.Currency)
	if err := checkText("account", r.Account, MaxAccountBytes, true); err != nil {
		return r, err
	}
	if err := checkText("order_id", r.OrderID, MaxOrderIDBytes, false); err != nil {
		return r, err
	}
	if r.AmountCents < 1 || r.AmountCents > MaxAmountCents {
		return r, Invalid("amount_cents", "must be an integer number of cents in 1..%d", MaxAmountCents)
	}
	if len(r.Currency) != 3 || strings.Trim(r.Currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
		return r, Invalid("currency", "must be three letters (ISO 4217 style), default %s", DefaultCurrency)
	}
	return r, nil
}

// Fingerprint hashes the canonical business fields and the API version, so
// field order, whitespace and defaults never change it.
func (r ChargeRequest) Fingerprint() string {
	var b bytes.Buffer
	for _, field := range []string{
		"api_version=" + APIVersion,
		"account=" + r.Account,
		"amount_cents=" + strconv.FormatInt(r.AmountCents, 10),
		"currency=" + r.Currency,
		"order_id=" + r.OrderID,
	} {
		b.WriteString(strconv.Quote(field))
		b.WriteByte('\n')
	}
	sum := sha256.Sum256(b.Bytes())
	return hex.EncodeToString(sum[:])
}

// ValidateKey checks an Idempotency-Key header value.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return Invalid("Idempotency-Key", "must not be empty (1..%d bytes of printable text)", MaxKeyBytes)
	case len(key) > MaxKeyBytes:
		return Invalid("Idempotency-Key", "is %d bytes; allowed 1..%d bytes", len(key), MaxKeyBytes)
	case !utf8.ValidString(key) || hasControl(key):
		return Invalid("Idempotency-Key", "must be printable text without control characters")
	}
	return nil
}

func checkText(name, v string, max int, required bool) error {
	switch {
	case v == "" && required:
		return Invalid(name, "is required: 1..%d bytes of printable text", max)
	case len(v) > max:
		return Invalid(name, "is %d bytes; allowed 1..%d bytes", len(v), max)
	case !utf8.ValidString(v) || hasControl(v):
		return Invalid(name, "must be printable text without control characters")
	}
	return nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return true
		}
	}
	return false
}

func jsonString(name string, v json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", Invalid(name, "must be a JSON string")
	}
	return s, nil
}

func jsonAmount(v json.RawMessage) (int64, error) {
	bad := Invalid("amount_cents", "must be an integer number of cents in 1..%d", MaxAmountCents)
	var n json.Number
	if err := json.Unmarshal(v, &n); err != nil {
		return 0, bad
	}
	i, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		return 0, bad
	}
	return i, nil
}

// ParseRange parses an integer query parameter, rejecting anything outside lo..hi.
func ParseRange(name, raw string, def, lo, hi int64) (int64, error) {
	if raw == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, Invalid(name, "must be an integer in %d..%d (got %q)", lo, hi, raw)
	}
	return n, nil
}
