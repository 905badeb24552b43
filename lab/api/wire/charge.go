package wire

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"strings"

	"github.com/idempotency-lab/lab/lab"
)

// chargeFields lists the fields of a charge body, for error messages.
const chargeFields = "account, amount_cents, currency, order_id"

// ParseChargeRequest decodes and validates the JSON body of POST /charges
// strictly. The body must be at most MaxBodyBytes of valid UTF-8 holding
// exactly one JSON object, followed by nothing but JSON whitespace; every key
// may appear once; unpaired UTF-16 surrogate escapes (\ud800) are refused,
// where encoding/json would silently turn them into U+FFFD.
//
// Fields: "account" (a string, 1..MaxAccountBytes bytes of printable text,
// required), "amount_cents" (a JSON integer in 1..lab.MaxAmountCents written in
// plain form: no fraction or exponent, even when integral (2500.0, 2.5e3), no
// quotes; -0 is refused with the other values out of range), "currency" (a
// string of three ASCII letters, default DefaultCurrency, upper-cased) and
// "order_id" (a string, 1..MaxOrderIDBytes bytes of printable text, optional).
// An optional field is either absent or holds a value: an explicit null or
// empty string is refused. Unknown fields are refused.
//
// Every failure is a *lab.InvalidError naming the offending field, or
// "body" when the body as a whole is wrong (too large, not UTF-8, not
// exactly one JSON object, unreadable). Checks run in that order: the body,
// then its structure (syntax, duplicate keys, trailing data), then the
// fields in the order they appear, then the bounds in lab.ChargeRequest's
// Normalize.
func ParseChargeRequest(body io.Reader) (lab.ChargeRequest, error) {
	data, err := readBody(body)
	if err != nil {
		return lab.ChargeRequest{}, err
	}
	fields, err := readObject(data)
	if err != nil {
		return lab.ChargeRequest{}, err
	}
	var (
		r         lab.ChargeRequest
		hasAmount bool
	)
	for _, f := range fields {
		switch f.name {
		case "account":
			r.Account, err = jsonString(f.name, f.value, true)
		case "currency":
			r.Currency, err = jsonString(f.name, f.value, false)
		case "order_id":
			r.OrderID, err = jsonString(f.name, f.value, false)
		case "amount_cents":
			r.AmountCents, err = jsonAmount(f.value)
			hasAmount = true
		default:
			err = lab.Invalid(fieldParam(f.name), "unknown field %s; allowed: %s", clip(f.name), chargeFields)
		}
		if err != nil {
			return lab.ChargeRequest{}, err
		}
	}
	if !hasAmount {
		return lab.ChargeRequest{}, lab.Invalid("amount_cents", "is required: an integer number of cents in 1..%d", lab.MaxAmountCents)
	}
	if r, err = r.Normalize(); err != nil {
		return lab.ChargeRequest{}, err
	}
	return r, nil
}

// jsonString decodes a JSON string value. An empty string is refused for
// optional fields (omit them instead); a required one reports "is required"
// from Normalize.
func jsonString(name string, v json.RawMessage, required bool) (string, error) {
	if rawKind(v) == "null" {
		return "", lab.Invalid(name, "must not be null: send a JSON string, or omit an optional field")
	}
	if rawKind(v) != "a string" {
		return "", lab.Invalid(name, "must be a JSON string, got %s", rawKind(v))
	}
	var s string
	if body := v[1 : len(v)-1]; bytes.IndexByte(body, '\\') < 0 {
		s = string(body) // no escapes: the bytes are the string (the body is valid UTF-8 JSON)
	} else if err := json.Unmarshal(v, &s); err != nil {
		return "", lab.Invalid(name, "must be a JSON string")
	}
	if s == "" && !required {
		return "", lab.Invalid(name, "must not be empty: omit the field instead")
	}
	return s, nil
}

// jsonAmount decodes amount_cents: a JSON number written as a plain integer.
func jsonAmount(v json.RawMessage) (int64, error) {
	bad := func(why string) error {
		return lab.Invalid("amount_cents", "must be an integer number of cents in 1..%d %s", lab.MaxAmountCents, why)
	}
	switch k := rawKind(v); k {
	case "null":
		return 0, bad("and must not be null")
	case "a number":
	default:
		return 0, bad("written as a JSON number, got " + k)
	}
	s := string(v) // JSON's grammar already refuses '+', leading zeros, hex
	if strings.ContainsAny(s, ".eE") {
		return 0, bad("written as a plain JSON integer (no fraction or exponent), got " + clip(s))
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil { // overflow
		return 0, lab.Invalid("amount_cents", "must be an integer number of cents in 1..%d", lab.MaxAmountCents)
	}
	return n, nil // Normalize checks the range; -0 is 0, out of range
}
