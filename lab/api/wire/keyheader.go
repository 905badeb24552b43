package wire

import (
	"strconv"
	"strings"

	"github.com/idempotency-lab/lab/lab"
)

// ParseKeyHeader reads the Idempotency-Key field lines of a request. The
// IETF draft defines the value as a Structured Field String ("…", with \"
// and \\ as its only escapes, printable ASCII inside); a bare value, as
// many clients send it, is accepted as the same key. So `"sf-1"` and
// `sf-1` name one key. More than one field line is refused: which one
// would the server honour? Either form must then hold printable text (see
// lab.ValidateKey). present is false when there is none.
func ParseKeyHeader(lines []string) (key string, present bool, err error) {
	switch len(lines) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, lab.Invalid(lab.KeyHeader, "must be sent once (got %d fields)", len(lines))
	}
	// Optional white space around a field value is SP and HTAB (RFC 9110):
	// any other space, U+00A0 say, stays in the key and ValidateKey refuses it.
	raw := strings.Trim(lines[0], " \t")
	if strings.HasPrefix(raw, `"`) {
		if key, err = parseSFString(raw); err != nil {
			return "", true, err
		}
	} else {
		if strings.ContainsAny(raw, `"\`) {
			return "", true, lab.Invalid(lab.KeyHeader, `holds a quote or a backslash outside a quoted string; send it as "…" with \" and \\`)
		}
		key = raw
	}
	return key, true, lab.ValidateKey(key)
}

// parseSFString decodes one RFC 8941 sf-string and refuses anything after it.
func parseSFString(raw string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(raw); i++ {
		switch c := raw[i]; {
		case c == '\\':
			if i+1 == len(raw) || raw[i+1] != '"' && raw[i+1] != '\\' {
				return "", lab.Invalid(lab.KeyHeader, `a quoted key may escape only \" and \\`)
			}
			i++
			b.WriteByte(raw[i])
		case c == '"':
			if i != len(raw)-1 {
				return "", lab.Invalid(lab.KeyHeader, "holds something after its closing quote")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", lab.Invalid(lab.KeyHeader, "a quoted key holds printable ASCII only (got byte %s)", strconv.QuoteToASCII(string(c)))
		default:
			b.WriteByte(c)
		}
	}
	return "", lab.Invalid(lab.KeyHeader, "opens a quote it never closes")
}

// OneField reads a header that a request may send once at most: its one
// field line, "" when there is none, and 400 naming the header when there
// are more (which one would the server honour?).
func OneField(name string, lines []string) (string, error) {
	if len(lines) > 1 {
		return "", lab.Invalid(name, "must be sent once (got %d fields)", len(lines))
	}
	if len(lines) == 0 {
		return "", nil
	}
	return lines[0], nil
}

// FormatKeyHeader writes key as the sf-string the response echoes; a key
// beyond printable ASCII, which no sf-string can hold, is echoed as it came.
func FormatKeyHeader(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return key
		}
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String()
}
