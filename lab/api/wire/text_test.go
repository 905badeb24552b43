package wire_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
)

// texts are strings for a field that names something: one of each kind
// the rule of printable text accepts or refuses (lab's own tests say what
// lab.CheckText makes of each). Every reader here must give the verdict
// lab.CheckText gives, with the same reason.
var texts = []string{
	// Accepted: letters of any script, spaces inside, emoji.
	"order-4711", "ordre-été", "注文-1", "a b", "a\u3000b", "café 😀", "\u2764\ufe0f", "e\u0301", "\ue000",
	// Format characters (Cf), bidi controls among them.
	"\u200b", "order\u200b-4711", "a\u200db", "abc\u202edef", "acct\u2066-1", "acct\u2069", "\u200fk", "k\u061c",
	"\ufeffk", "or\u00adder", "k\u2060", "k\U000e0041",
	// Other invisible characters, which Unicode marks default-ignorable.
	"\u3164", "k\u115f", "k\u1160", "k\uffa0", "e\u034f",
	// Controls and separators.
	"a\x01b", "a\x7f", "a\u0085", "a\u2028b", "a\u2029b", "a\xff",
	// Whitespace at either end, or nothing but whitespace.
	"   ", "\u3000", "\u00a0\u00a0", "k\u00a0", "\u00a0k", "k ", " k", "k\u2003",
}

// TestTextsCoverTheRule keeps the list honest: it holds texts the rule
// accepts and texts it refuses.
func TestTextsCoverTheRule(t *testing.T) {
	accepted := 0
	for _, s := range texts {
		if lab.CheckText("p", s, lab.MaxAccountBytes) == nil {
			accepted++
		}
	}
	if accepted < 9 || len(texts)-accepted < 25 {
		t.Fatalf("%d of %d texts accepted: the list no longer covers the rule", accepted, len(texts))
	}
}

// sameVerdict fails unless err is the verdict of lab.CheckText on text
// under param: nil for nil, else an *InvalidError naming param with the
// same reason.
func sameVerdict(t *testing.T, err error, param, text string, max int) {
	t.Helper()
	want := lab.CheckText(param, text, max)
	if want == nil {
		if err != nil {
			t.Fatalf("%q: %v; lab.CheckText accepts it", text, err)
		}
		return
	}
	var ie *lab.InvalidError
	if !errors.As(err, &ie) || ie.Error() != want.Error() {
		t.Fatalf("%q: got %v; want %v", text, err, want)
	}
}

// TestParseKeyHeaderPrintableText sends each text in the Idempotency-Key
// header, bare and, when it is printable ASCII, as an sf-string. Only SP
// and HTAB around the value are optional white space: U+00A0 is not
// trimmed, so `k` and `k` + U+00A0 are never one key nor two.
func TestParseKeyHeaderPrintableText(t *testing.T) {
	for _, text := range texts {
		var forms []string
		if strings.Trim(text, " \t") == text {
			forms = append(forms, text)
		}
		if sf := wire.FormatKeyHeader(text); strings.HasPrefix(sf, `"`) { // printable ASCII
			forms = append(forms, sf)
		}
		for _, line := range forms {
			key, present, err := wire.ParseKeyHeader([]string{line})
			if !present {
				t.Fatalf("%q: present must be true", line)
			}
			sameVerdict(t, err, lab.KeyHeader, text, lab.MaxKeyBytes)
			if err == nil && key != text {
				t.Fatalf("%q: got key %q; want %q", line, key, text)
			}
		}
	}
	// The optional white space of HTTP is trimmed; it is not part of the key.
	if key, _, err := wire.ParseKeyHeader([]string{" \tk \t"}); err != nil || key != "k" {
		t.Fatalf("SP and HTAB around the value: %q, %v", key, err)
	}
}

func TestParseTextPrintableText(t *testing.T) {
	for _, param := range []string{"key", "account", "order_id"} {
		for _, text := range texts {
			q, err := wire.ParseQuery(param + "=" + urlEscape(text))
			if err != nil {
				t.Fatal(err)
			}
			v, err := q.Text(param, "def", lab.MaxAccountBytes)
			sameVerdict(t, err, param, text, lab.MaxAccountBytes)
			if err == nil && v != text {
				t.Fatalf("%s=%q: got %q", param, text, v)
			}
		}
	}
}

// urlEscape percent-encodes every byte of s that is not an ASCII letter or
// digit, invalid UTF-8 included.
func urlEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteString("%" + strings.ToUpper(strconv.FormatUint(uint64(c)|0x100, 16)[1:]))
	}
	return b.String()
}

// jsonEscape writes s as a JSON string with every rune beyond printable
// ASCII as \u escapes (a surrogate pair above U+FFFF).
func jsonEscape(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteString(`\` + string(r))
		case r >= 0x20 && r < 0x7f:
			b.WriteRune(r)
		case r > 0xffff:
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, hi, lo)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// TestChargeBodyPrintableText puts each text in the body's account and
// order_id, as raw UTF-8 (the plain reader) and \u-escaped (the general
// decoder): the two readers refuse the same texts with the same reason.
func TestChargeBodyPrintableText(t *testing.T) {
	for _, text := range texts {
		if text == "a\xff" {
			continue // the body as a whole is refused first: see TestParseChargeRequest
		}
		for _, field := range []string{"account", "order_id"} {
			forms := map[string]string{"Escaped": jsonEscape(text)}
			if !strings.ContainsFunc(text, func(r rune) bool { return r < 0x20 }) { // JSON has no raw C0 in a string
				forms["Raw"] = `"` + text + `"`
			}
			for form, value := range forms {
				body := `{"account":"acct-1","amount_cents":2500,"` + field + `":` + value + `}`
				if field == "account" {
					body = `{"account":` + value + `,"amount_cents":2500}`
				}
				r, err := wire.ParseChargeRequest(strings.NewReader(body))
				sameVerdict(t, err, field, text, 64)
				got := r.Account
				if field == "order_id" {
					got = r.OrderID
				}
				if err == nil && got != text {
					t.Fatalf("%s (%s): got %s %q; want %q", body, form, field, got, text)
				}
			}
		}
	}
}

// TestKeysAreNotNormalized: keys are compared byte for byte. é as one code
// point and as e + U+0301 are both printable, and stay two keys.
func TestKeysAreNotNormalized(t *testing.T) {
	composed, decomposed := "caf\u00e9", "cafe\u0301"
	for _, k := range []string{composed, decomposed} {
		key, _, err := wire.ParseKeyHeader([]string{k})
		if err != nil || key != k {
			t.Fatalf("%q: got %q, %v", k, key, err)
		}
	}
}
