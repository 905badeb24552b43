package lab

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
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

const asciiLetters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// Normalize applies defaults and validates every field: account 1..64 bytes
// and order_id 0..64 bytes of printable text (see CheckText), amount_cents in 1..MaxAmountCents, currency three ASCII
// letters (upper-cased; empty means DefaultCurrency).
func (r ChargeRequest) Normalize() (ChargeRequest, error) {
	if err := checkText("account", r.Account, MaxAccountBytes, true); err != nil {
		return r, err
	}
	if err := checkText("order_id", r.OrderID, MaxOrderIDBytes, false); err != nil {
		return r, err
	}
	if r.AmountCents < 1 || r.AmountCents > MaxAmountCents {
		return r, Invalid("amount_cents", "must be an integer number of cents in 1..%d", MaxAmountCents)
	}
	if r.Currency == "" {
		r.Currency = DefaultCurrency
	}
	// ASCII letters only, checked before upper-casing: "uſd" must not become "USD".
	if len(r.Currency) != 3 || strings.Trim(r.Currency, asciiLetters) != "" {
		return r, Invalid("currency", "must be three letters (ISO 4217 style), default %s", DefaultCurrency)
	}
	r.Currency = strings.ToUpper(r.Currency)
	return r, nil
}

// Fingerprint hashes the canonical business fields and the API version, so
// field order, whitespace and defaults never change it.
func (r ChargeRequest) Fingerprint() string {
	var buf [256]byte // the usual request fits: no allocation for the text hashed
	b := buf[:0]
	for _, field := range [...]string{
		"api_version=" + APIVersion,
		"account=" + r.Account,
		"amount_cents=" + strconv.FormatInt(r.AmountCents, 10),
		"currency=" + r.Currency,
		"order_id=" + r.OrderID,
	} {
		b = strconv.AppendQuote(b, field)
		b = append(b, '\n')
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// KeyHeader is the request header that names an operation; a key that
// breaks the rule is reported under its name.
const KeyHeader = "Idempotency-Key"

// ValidateKey checks an Idempotency-Key header value: 1..MaxKeyBytes bytes
// of printable text (see CheckText). Keys are compared byte for byte, never
// normalized.
func ValidateKey(key string) error {
	if key == "" {
		return Invalid(KeyHeader, "must not be empty (1..%d bytes of printable text)", MaxKeyBytes)
	}
	return CheckText(KeyHeader, key, MaxKeyBytes)
}

func checkText(name, v string, max int, required bool) error {
	switch {
	case v == "" && required:
		return Invalid(name, "is required: 1..%d bytes of printable text", max)
	case len(v) > max:
		return Invalid(name, "is %d bytes; allowed 1..%d bytes", len(v), max)
	}
	return textError(name, v, max)
}
