package lab

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf16"
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

// MaxBodyBytes bounds the body of POST /charges.
const MaxBodyBytes = 64 << 10

// chargeFields lists the fields of a charge body, for error messages.
const chargeFields = "account, amount_cents, currency, order_id"

// ParseChargeRequest decodes and validates the JSON body of POST /charges
// strictly. The body must be at most MaxBodyBytes of valid UTF-8 holding
// exactly one JSON object, followed by nothing but JSON whitespace; every key
// may appear once; unpaired UTF-16 surrogate escapes (\ud800) are refused,
// where encoding/json would silently turn them into U+FFFD.
//
// Fields: "account" (a string, 1..MaxAccountBytes bytes of printable text,
// required), "amount_cents" (a JSON integer in 1..MaxAmountCents written in
// plain form: no fraction or exponent, even when integral (2500.0, 2.5e3), no
// quotes; -0 is refused with the other values out of range), "currency" (a
// string of three ASCII letters, default DefaultCurrency, upper-cased) and
// "order_id" (a string, 1..MaxOrderIDBytes bytes of printable text, optional).
// An optional field is either absent or holds a value: an explicit null or
// empty string is refused. Unknown fields are refused.
//
// Every failure is an *InvalidError naming the offending field, or "body"
// when the body as a whole is wrong (too large, not UTF-8, not exactly one
// JSON object, unreadable). Checks run in that order: the body, then its
// structure (syntax, duplicate keys, trailing data), then the fields in the
// order they appear, then the bounds in Normalize.
func ParseChargeRequest(body io.Reader) (ChargeRequest, error) {
	data, err := readBody(body)
	if err != nil {
		return ChargeRequest{}, err
	}
	if !utf8.Valid(data) {
		return ChargeRequest{}, Invalid("body", "must be valid UTF-8 (invalid byte at offset %d)", invalidUTF8At(data))
	}
	fields, ok := splitPlainObject(data)
	if !ok {
		if fields, err = splitObject(data); err != nil {
			return ChargeRequest{}, err
		}
	}
	if off, ok := loneSurrogate(data); !ok {
		return ChargeRequest{}, Invalid("body", "must not hold an unpaired UTF-16 surrogate escape (at offset %d)", off)
	}
	var (
		r         ChargeRequest
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
			err = Invalid(fieldParam(f.name), "unknown field %s; allowed: %s", clip(f.name), chargeFields)
		}
		if err != nil {
			return ChargeRequest{}, err
		}
	}
	if !hasAmount {
		return ChargeRequest{}, Invalid("amount_cents", "is required: an integer number of cents in 1..%d", MaxAmountCents)
	}
	if r, err = r.Normalize(); err != nil {
		return ChargeRequest{}, err
	}
	return r, nil
}

// readBody reads at most MaxBodyBytes: a longer body is refused, never
// truncated and then parsed.
func readBody(body io.Reader) ([]byte, error) {
	if body == nil {
		return nil, Invalid("body", "must be a JSON object, got an empty body")
	}
	data, err := io.ReadAll(io.LimitReader(body, MaxBodyBytes+1))
	var tooLarge *http.MaxBytesError
	switch {
	case len(data) > MaxBodyBytes || errors.As(err, &tooLarge):
		return nil, Invalid("body", "is too large: at most %d bytes", MaxBodyBytes)
	case err != nil:
		return nil, Invalid("body", "could not be read: %v", err)
	}
	return data, nil
}

// field is one member of the body's object, its value still raw JSON.
type field struct {
	name  string
	value json.RawMessage
}

// splitObject checks that data is exactly one JSON object with distinct keys
// followed only by whitespace, and returns its members in order.
func splitObject(data []byte) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	syntax := func(err error) error {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Invalid("body", "must be a JSON object: %v", err)
	}
	tok, err := dec.Token()
	if err == io.EOF {
		return nil, Invalid("body", "must be a JSON object, got an empty body")
	}
	if err != nil {
		return nil, syntax(err)
	}
	if tok != json.Delim('{') {
		return nil, Invalid("body", "must be a JSON object, got %s", jsonKind(tok))
	}
	var fields []field
	seen := map[string]bool{}
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, syntax(err)
		}
		if tok == json.Delim('}') {
			break
		}
		name, ok := tok.(string)
		if !ok { // the decoder only returns a string or '}' here; kept for safety
			return nil, Invalid("body", "must be a JSON object: expected a key at offset %d", dec.InputOffset())
		}
		if seen[name] {
			return nil, Invalid(fieldParam(name), "duplicate field %s: each field may appear only once", clip(name))
		}
		seen[name] = true
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, syntax(err)
		}
		fields = append(fields, field{name, value})
	}
	end := dec.InputOffset()
	if rest := bytes.TrimLeft(data[end:], " \t\r\n"); len(rest) > 0 {
		return nil, Invalid("body", "must hold exactly one JSON object and nothing after it: found %s at offset %d",
			clip(string(rest[:min(len(rest), 16)])), len(data)-len(rest))
	}
	return fields, nil
}

// splitPlainObject reads the body every client sends — one flat object of
// distinct keys whose values are strings without escapes or integers —
// without the general decoder, which costs more than the rest of a replay.
// It gives the members splitObject would, or false for anything else (which
// splitObject then accepts or names the fault of). data is valid UTF-8.
func splitPlainObject(data []byte) ([]field, bool) {
	i := 0
	space := func() {
		for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r' || data[i] == '\n') {
			i++
		}
	}
	str := func() (int, int, bool) { // a string without escapes or control bytes: its span, quotes included
		if i >= len(data) || data[i] != '"' {
			return 0, 0, false
		}
		start := i
		for i++; i < len(data); i++ {
			switch c := data[i]; {
			case c == '"':
				i++
				return start, i, true
			case c == '\\' || c < 0x20:
				return 0, 0, false
			}
		}
		return 0, 0, false
	}
	integer := func() (int, int, bool) { // -?(0|[1-9][0-9]*), not followed by a fraction or exponent
		start := i
		if i < len(data) && data[i] == '-' {
			i++
		}
		digits := i
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
		n := i - digits
		if n == 0 || n > 1 && data[digits] == '0' || i < len(data) && (data[i] == '.' || data[i] == 'e' || data[i] == 'E') {
			return 0, 0, false
		}
		return start, i, true
	}
	space()
	if i >= len(data) || data[i] != '{' {
		return nil, false
	}
	i++
	space()
	fields := make([]field, 0, 4)
	if i < len(data) && data[i] == '}' {
		i++
	} else {
		for {
			ks, ke, ok := str()
			if !ok {
				return nil, false
			}
			name := string(data[ks+1 : ke-1])
			for _, f := range fields {
				if f.name == name {
					return nil, false // a duplicate: splitObject names it
				}
			}
			space()
			if i >= len(data) || data[i] != ':' {
				return nil, false
			}
			i++
			space()
			var vs, ve int
			if i < len(data) && data[i] == '"' {
				vs, ve, ok = str()
			} else {
				vs, ve, ok = integer()
			}
			if !ok {
				return nil, false
			}
			fields = append(fields, field{name, json.RawMessage(data[vs:ve])})
			space()
			if i < len(data) && data[i] == ',' {
				i++
				space()
				continue
			}
			if i < len(data) && data[i] == '}' {
				i++
				break
			}
			return nil, false
		}
	}
	space()
	return fields, i == len(data)
}

// jsonKind names the kind of a JSON token for error messages.
func jsonKind(tok json.Token) string {
	switch tok := tok.(type) {
	case json.Delim:
		if tok == '[' {
			return "an array"
		}
		return fmt.Sprintf("%q", string(tok))
	case string:
		return "a string"
	case json.Number, float64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}

// rawKind names the kind of a raw JSON value for error messages.
func rawKind(v json.RawMessage) string {
	switch {
	case len(v) == 0:
		return "nothing"
	case v[0] == '{':
		return "an object"
	case v[0] == '[':
		return "an array"
	case v[0] == '"':
		return "a string"
	case v[0] == 't' || v[0] == 'f':
		return "a boolean"
	case v[0] == 'n':
		return "null"
	}
	return "a number"
}

// loneSurrogate reports the offset of the first \u escape in data that is an
// unpaired UTF-16 surrogate. data must be valid JSON, where a backslash only
// occurs inside strings.
func loneSurrogate(data []byte) (int, bool) {
	hex4 := func(i int) (rune, bool) { // the \uXXXX escape at data[i:]
		if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(data[i+2:i+6]), 16, 32)
		return rune(n), err == nil
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		r, ok := hex4(i)
		if !ok {
			i++ // a two-byte escape such as \\ or \"
			continue
		}
		switch {
		case utf16.IsSurrogate(r) && r < 0xdc00: // high: a low one must follow
			if lo, ok := hex4(i + 6); ok && lo >= 0xdc00 && lo <= 0xdfff {
				i += 11
				continue
			}
			return i, false
		case utf16.IsSurrogate(r):
			return i, false
		}
		i += 5
	}
	return 0, true
}

// invalidUTF8At is the offset of the first byte of data that is not UTF-8.
func invalidUTF8At(data []byte) int {
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(data)
}

// fieldParam is the parameter an error about the field name is reported
// under: the name itself when it is a plain identifier, else "body" (the
// message then quotes it).
func fieldParam(name string) string {
	if len(name) == 0 || len(name) > 64 {
		return "body"
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return "body"
		}
	}
	return name
}

// clip quotes s for an error message, cut to at most 64 bytes.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return strconv.Quote(s)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…"
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

// jsonString decodes a JSON string value. An empty string is refused for
// optional fields (omit them instead); a required one reports "is required"
// from Normalize.
func jsonString(name string, v json.RawMessage, required bool) (string, error) {
	if rawKind(v) == "null" {
		return "", Invalid(name, "must not be null: send a JSON string, or omit an optional field")
	}
	if rawKind(v) != "a string" {
		return "", Invalid(name, "must be a JSON string, got %s", rawKind(v))
	}
	var s string
	if body := v[1 : len(v)-1]; bytes.IndexByte(body, '\\') < 0 {
		s = string(body) // no escapes: the bytes are the string (the body is valid UTF-8 JSON)
	} else if err := json.Unmarshal(v, &s); err != nil {
		return "", Invalid(name, "must be a JSON string")
	}
	if s == "" && !required {
		return "", Invalid(name, "must not be empty: omit the field instead")
	}
	return s, nil
}

// jsonAmount decodes amount_cents: a JSON number written as a plain integer.
func jsonAmount(v json.RawMessage) (int64, error) {
	bad := func(why string) error {
		return Invalid("amount_cents", "must be an integer number of cents in 1..%d %s", MaxAmountCents, why)
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
		return 0, Invalid("amount_cents", "must be an integer number of cents in 1..%d", MaxAmountCents)
	}
	return n, nil // Normalize checks the range; -0 is 0, out of range
}

// ParseRange parses an integer query parameter, rejecting anything outside
// lo..hi or not written in canonical decimal (see ParseInt). It cannot tell
// an absent parameter from an empty one: raw "" gives def. New code should
// call ParseInt or Query.Int, which refuse an explicitly empty value.
func ParseRange(name, raw string, def, lo, hi int64) (int64, error) {
	return ParseInt(name, raw, raw != "", def, lo, hi)
}
