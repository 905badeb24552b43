package wire

import (
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/idempotency-lab/lab/lab"
)

// Query parameters are validated before anything reads a store or a
// database: a value is absent (the default applies), or present and then
// never empty and always within its bounds. Every failure is a
// *lab.InvalidError naming the parameter.

// MaxNameBytes bounds a name parameter (store, fault, scenario, format…).
const MaxNameBytes = 32

// Query is a request's query string, parsed strictly.
type Query struct{ values url.Values }

// ParseQuery parses a raw query string (URL.RawQuery). A malformed
// percent-escape ("%zz") or a ';' separator, which url.URL.Query silently
// drops with the pair it is in, is a *lab.InvalidError naming "query".
func ParseQuery(raw string) (Query, error) {
	v, err := url.ParseQuery(raw)
	if err != nil {
		return Query{}, lab.Invalid("query", "is malformed: %v", err)
	}
	return Query{v}, nil
}

// Names lists the parameters present, sorted.
func (q Query) Names() []string {
	names := make([]string, 0, len(q.values))
	for n := range q.values {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Allow refuses any parameter but the named ones, and any parameter given
// twice: a typo or a stray parameter is a 400 naming it, never silently
// ignored, and a route sees each value once whether or not it reads it.
func (q Query) Allow(names ...string) error {
	for _, n := range q.Names() {
		if !slices.Contains(names, n) {
			param := n
			if !isName(n) {
				param = "query" // the problem names it quoted, not raw
			}
			if len(names) == 0 {
				return lab.Invalid(param, "%s is not a parameter of this route, which takes none", clip(n))
			}
			return lab.Invalid(param, "%s is not a parameter of this route; it takes %s", clip(n), strings.Join(names, ", "))
		}
		if vs := q.values[n]; len(vs) > 1 {
			return lab.Invalid(n, "must be given at most once (got %d values)", len(vs))
		}
	}
	return nil
}

// Lookup returns the parameter's value and whether it is present. A
// parameter given more than once is a *lab.InvalidError: two readers must never
// see two different values.
func (q Query) Lookup(name string) (value string, present bool, err error) {
	vs, ok := q.values[name]
	switch {
	case !ok:
		return "", false, nil
	case len(vs) > 1:
		return "", true, lab.Invalid(name, "must be given at most once (got %d values)", len(vs))
	}
	return vs[0], true, nil
}

// Int is ParseInt on the named parameter.
func (q Query) Int(name string, def, lo, hi int64) (int64, error) {
	raw, present, err := q.Lookup(name)
	if err != nil {
		return 0, err
	}
	return ParseInt(name, raw, present, def, lo, hi)
}

// Text is ParseText on the named parameter.
func (q Query) Text(name, def string, max int) (string, error) {
	raw, present, err := q.Lookup(name)
	if err != nil {
		return "", err
	}
	return ParseText(name, raw, present, def, max)
}

// Name is ParseName on the named parameter.
func (q Query) Name(name, def string) (string, error) {
	raw, present, err := q.Lookup(name)
	if err != nil {
		return "", err
	}
	return ParseName(name, raw, present, def)
}

// Choice is ParseChoice on the named parameter.
func (q Query) Choice(name, def string, allowed ...string) (string, error) {
	raw, present, err := q.Lookup(name)
	if err != nil {
		return "", err
	}
	return ParseChoice(name, raw, present, def, allowed...)
}

// ParseInt parses an integer parameter in lo..hi. Absent, it is def;
// present, it must be written in canonical decimal: ASCII digits with an
// optional leading '-', no leading zeros, no '+', spaces, fraction,
// exponent, hex or digit separators, and not "-0". Empty is refused.
func ParseInt(name, raw string, present bool, def, lo, hi int64) (int64, error) {
	if !present {
		return def, nil
	}
	if raw == "" {
		return 0, lab.Invalid(name, "must not be empty: an integer in %d..%d, or leave it out for %d", lo, hi, def)
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || strconv.FormatInt(n, 10) != raw || n < lo || n > hi {
		return 0, lab.Invalid(name, "must be an integer in %d..%d (got %s)", lo, hi, clip(raw))
	}
	return n, nil
}

// ParseText parses a free-text parameter (key, account, order_id, tenant):
// absent, it is def; present, it must be 1..max bytes of printable text
// (see lab.CheckText): valid UTF-8 without control, format or other invisible
// characters and without whitespace at either end. Spaces inside and
// non-ASCII letters are allowed, as they are in the charge body.
func ParseText(name, raw string, present bool, def string, max int) (string, error) {
	switch {
	case !present:
		return def, nil
	case raw == "":
		return "", lab.Invalid(name, "must not be empty: 1..%d bytes of printable text, or leave it out", max)
	case len(raw) > max:
		return "", lab.Invalid(name, "is %d bytes; allowed 1..%d bytes", len(raw), max)
	}
	if err := lab.CheckText(name, raw, max); err != nil {
		return "", err
	}
	return raw, nil
}

// ParseName parses a name parameter (store, fault, scenario, format,
// scope): absent, it is def; present, it must be 1..MaxNameBytes bytes: a
// lowercase ASCII letter, then lowercase letters, digits, '_', '-' or '+'
// (the charset of variant names). Whether the name is known is the
// caller's check (see ParseChoice).
func ParseName(name, raw string, present bool, def string) (string, error) {
	// A name holds no spaces: a space here is a '+' the query did not
	// encode (store=redis+postgres, as typed in a shell).
	raw = strings.ReplaceAll(raw, " ", "+")
	switch {
	case !present:
		return def, nil
	case raw == "":
		return "", lab.Invalid(name, "must not be empty: a name, or leave it out")
	case !isName(raw):
		return "", lab.Invalid(name, "must be a name of 1..%d bytes: a lowercase letter, then a-z, 0-9, '_', '-' or '+' (got %s)", MaxNameBytes, clip(raw))
	}
	return raw, nil
}

// ParseChoice is ParseName restricted to the allowed names.
func ParseChoice(name, raw string, present bool, def string, allowed ...string) (string, error) {
	v, err := ParseName(name, raw, present, def)
	if err != nil || !present {
		return v, err
	}
	if !slices.Contains(allowed, v) {
		return "", lab.Invalid(name, "must be one of %s (got %s)", strings.Join(allowed, ", "), clip(raw))
	}
	return v, nil
}

func isName(s string) bool {
	if len(s) == 0 || len(s) > MaxNameBytes || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '+') {
			return false
		}
	}
	return true
}
