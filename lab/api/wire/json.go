// Package wire reads what clients send the lab's HTTP API, strictly: the
// body of POST /charges and of POST /lab/join, query strings, and the
// Idempotency-Key header. Every value is absent (a default applies), or
// present and then valid and within its bounds; anything else is a
// *lab.InvalidError naming the parameter, which the API answers as a 400.
// The package holds the one strict JSON reader every route that takes a
// JSON body uses, the payment provider's included.
package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/idempotency-lab/lab/lab"
)

// MaxBodyBytes bounds the body of POST /charges and POST /lab/join.
const MaxBodyBytes = 64 << 10

// Decode reads data, a whole request body, into v as strictly as a charge
// is read (see readObject), and refuses a member v has no field for. Every
// failure is a *lab.InvalidError naming "body" or the field at fault.
func Decode(data []byte, v any) error {
	if _, err := readObject(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return lab.Invalid("body", "must be one JSON object of known fields: %v", err)
	}
	return nil
}

// readObject is the strict reader: data must be valid UTF-8 holding exactly
// one JSON object, followed by nothing but JSON whitespace; every key may
// appear once; unpaired UTF-16 surrogate escapes (\ud800) are refused,
// where encoding/json would silently turn them into U+FFFD. It returns the
// object's members in order, their values still raw JSON. Checks run in
// that order: UTF-8, then the structure (syntax, duplicate keys, trailing
// data), then the escapes.
func readObject(data []byte) ([]field, error) {
	if !utf8.Valid(data) {
		return nil, lab.Invalid("body", "must be valid UTF-8 (invalid byte at offset %d)", invalidUTF8At(data))
	}
	fields, ok := splitPlainObject(data)
	if !ok {
		var err error
		if fields, err = splitObject(data); err != nil {
			return nil, err
		}
	}
	if off, ok := loneSurrogate(data); !ok {
		return nil, lab.Invalid("body", "must not hold an unpaired UTF-16 surrogate escape (at offset %d)", off)
	}
	return fields, nil
}

// readBody reads at most MaxBodyBytes: a longer body is refused, never
// truncated and then parsed.
func readBody(body io.Reader) ([]byte, error) {
	if body == nil {
		return nil, lab.Invalid("body", "must be a JSON object, got an empty body")
	}
	data, err := io.ReadAll(io.LimitReader(body, MaxBodyBytes+1))
	var tooLarge *http.MaxBytesError
	switch {
	case len(data) > MaxBodyBytes || errors.As(err, &tooLarge):
		return nil, lab.Invalid("body", "is too large: at most %d bytes", MaxBodyBytes)
	case err != nil:
		return nil, lab.Invalid("body", "could not be read: %v", err)
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
		return lab.Invalid("body", "must be a JSON object: %v", err)
	}
	tok, err := dec.Token()
	if err == io.EOF {
		return nil, lab.Invalid("body", "must be a JSON object, got an empty body")
	}
	if err != nil {
		return nil, syntax(err)
	}
	if tok != json.Delim('{') {
		return nil, lab.Invalid("body", "must be a JSON object, got %s", jsonKind(tok))
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
			return nil, lab.Invalid("body", "must be a JSON object: expected a key at offset %d", dec.InputOffset())
		}
		if seen[name] {
			return nil, lab.Invalid(fieldParam(name), "duplicate field %s: each field may appear only once", clip(name))
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
		return nil, lab.Invalid("body", "must hold exactly one JSON object and nothing after it: found %s at offset %d",
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
