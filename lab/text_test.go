package lab_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/idempotency-lab/lab/lab"
)

// textCase is one string for a field that names something, and what the
// rule of printable text makes of it: accepted, or refused with a reason
// holding want.
type textCase struct {
	name, text string
	want       string // "" when accepted
}

func textCases() []textCase {
	return []textCase{
		// Accepted: letters of any script, spaces inside, emoji.
		{"ASCII", "order-4711", ""},
		{"Accents", "ordre-été", ""},
		{"CJK", "注文-1", ""},
		{"InnerSpace", "a b", ""},
		{"InnerIdeographicSpace", "a\u3000b", ""},
		{"Emoji", "café 😀", ""},
		{"EmojiVariationSelector", "\u2764\ufe0f", ""},
		{"CombiningAccent", "e\u0301", ""},
		{"PrivateUse", "\ue000", ""},

		// Format characters (Cf), bidi controls among them.
		{"OnlyZeroWidthSpace", "\u200b", "U+200B (a format character, invisible) at byte 0"},
		{"ZeroWidthSpaceInside", "order\u200b-4711", "U+200B (a format character, invisible) at byte 5"},
		{"ZeroWidthJoiner", "a\u200db", "U+200D (a format character"},
		{"RightToLeftOverride", "abc\u202edef", "bidi control U+202E"},
		{"LeftToRightIsolate", "acct\u2066-1", "bidi control U+2066"},
		{"PopDirectionalIsolate", "acct\u2069", "bidi control U+2069"},
		{"RightToLeftMark", "\u200fk", "bidi control U+200F"},
		{"ArabicLetterMark", "k\u061c", "bidi control U+061C"},
		{"ByteOrderMark", "\ufeffk", "U+FEFF (a format character"},
		{"SoftHyphen", "or\u00adder", "U+00AD (a format character"},
		{"WordJoiner", "k\u2060", "U+2060 (a format character"},
		{"TagCharacter", "k\U000e0041", "U+E0041 (a format character"},

		// Other invisible characters, which Unicode marks default-ignorable.
		{"HangulFiller", "\u3164", "U+3164 (invisible: Unicode marks it default-ignorable)"},
		{"HangulChoseongFiller", "k\u115f", "U+115F (invisible: Unicode marks it default-ignorable)"},
		{"HangulJungseongFiller", "k\u1160", "U+1160 (invisible: Unicode marks it default-ignorable)"},
		{"HalfwidthHangulFiller", "k\uffa0", "U+FFA0 (invisible: Unicode marks it default-ignorable)"},
		{"CombiningGraphemeJoiner", "e\u034f", "U+034F (invisible: Unicode marks it default-ignorable)"},

		// Controls and separators, as before and beyond.
		{"C0", "a\x01b", "control character U+0001"},
		{"DEL", "a\x7f", "control character U+007F"},
		{"C1", "a\u0085", "control character U+0085"},
		{"LineSeparator", "a\u2028b", "U+2028 (a line separator)"},
		{"ParagraphSeparator", "a\u2029b", "U+2029 (a paragraph separator)"},
		{"InvalidUTF8", "a\xff", "not valid UTF-8 (invalid byte at offset 1)"},

		// Whitespace at either end, or nothing but whitespace.
		{"Spaces", "   ", "only whitespace, beginning with U+0020"},
		{"IdeographicSpace", "\u3000", "only whitespace, beginning with U+3000"},
		{"NoBreakSpaces", "\u00a0\u00a0", "only whitespace, beginning with U+00A0"},
		{"TrailingNoBreakSpace", "k\u00a0", "ends with whitespace U+00A0 at byte 1"},
		{"LeadingNoBreakSpace", "\u00a0k", "starts with whitespace U+00A0"},
		{"TrailingSpace", "k ", "ends with whitespace U+0020"},
		{"LeadingSpace", " k", "starts with whitespace U+0020"},
		{"TrailingEmSpace", "k\u2003", "ends with whitespace U+2003"},
	}
}

// refused checks that err is the 400 of the rule: an *InvalidError naming
// param, saying "must be 1..max bytes of printable text", the fault and the
// rule.
func refused(t *testing.T, err error, param, want string) {
	t.Helper()
	var ie *lab.InvalidError
	if !errors.As(err, &ie) {
		t.Fatalf("got %v (%T); want an *InvalidError naming %q", err, err, param)
	}
	if ie.Param != param || !strings.Contains(ie.Reason, " bytes of printable text: ") || !strings.Contains(ie.Reason, want) ||
		!strings.Contains(ie.Reason, "without control, format (Cf) or other invisible characters, and without whitespace at either end") {
		t.Fatalf("got param %q reason %q; want param %q, the rule and %q", ie.Param, ie.Reason, param, want)
	}
}

func TestValidateKeyPrintableText(t *testing.T) {
	for _, tc := range textCases() {
		t.Run(tc.name, func(t *testing.T) {
			err := lab.ValidateKey(tc.text)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ValidateKey(%q) = %v", tc.text, err)
				}
				return
			}
			refused(t, err, lab.KeyHeader, tc.want)
		})
	}
}

func TestCheckText(t *testing.T) {
	for _, tc := range textCases() {
		t.Run(tc.name, func(t *testing.T) {
			err := lab.CheckText("Lab-Run", tc.text, 64)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("CheckText(%q) = %v", tc.text, err)
				}
				return
			}
			refused(t, err, "Lab-Run", tc.want)
		})
	}
	wantInvalid(t, lab.CheckText("key", "", lab.MaxKeyBytes), "key", "must not be empty")
	wantInvalid(t, lab.CheckText("key", strings.Repeat("k", 256), lab.MaxKeyBytes), "key", "1..255")
}

// TestParseKeyHeaderPrintableText sends each text in the Idempotency-Key
// header, bare and, when it is printable ASCII, as an sf-string. Only SP
// and HTAB around the value are optional white space: U+00A0 is not
// trimmed, so `k` and `k` + U+00A0 are never one key nor two.
func TestParseKeyHeaderPrintableText(t *testing.T) {
	for _, tc := range textCases() {
		t.Run(tc.name, func(t *testing.T) {
			var forms []string
			if strings.Trim(tc.text, " \t") == tc.text {
				forms = append(forms, tc.text)
			}
			if sf := lab.FormatKeyHeader(tc.text); strings.HasPrefix(sf, `"`) { // printable ASCII
				forms = append(forms, sf)
			}
			for _, line := range forms {
				key, present, err := lab.ParseKeyHeader([]string{line})
				if !present {
					t.Fatalf("%q: present must be true", line)
				}
				if tc.want == "" {
					if err != nil || key != tc.text {
						t.Fatalf("%q: got %q, %v; want %q", line, key, err, tc.text)
					}
					continue
				}
				refused(t, err, lab.KeyHeader, tc.want)
			}
		})
	}
	// The optional white space of HTTP is trimmed; it is not part of the key.
	if key, _, err := lab.ParseKeyHeader([]string{" \tk \t"}); err != nil || key != "k" {
		t.Fatalf("SP and HTAB around the value: %q, %v", key, err)
	}
}

func TestParseTextPrintableText(t *testing.T) {
	for _, param := range []string{"key", "account", "order_id"} {
		for _, tc := range textCases() {
			t.Run(param+"/"+tc.name, func(t *testing.T) {
				q, err := lab.ParseQuery(param + "=" + urlEscape(tc.text))
				if err != nil {
					t.Fatal(err)
				}
				v, err := q.Text(param, "def", lab.MaxAccountBytes)
				if tc.want == "" {
					if err != nil || v != tc.text {
						t.Fatalf("got %q, %v; want %q", v, err, tc.text)
					}
					return
				}
				refused(t, err, param, tc.want)
			})
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
	for _, tc := range textCases() {
		if tc.name == "InvalidUTF8" {
			continue // the body as a whole is refused first: see TestParseChargeRequest
		}
		for _, field := range []string{"account", "order_id"} {
			forms := map[string]string{"Escaped": jsonEscape(tc.text)}
			if !strings.ContainsFunc(tc.text, func(r rune) bool { return r < 0x20 }) { // JSON has no raw C0 in a string
				forms["Raw"] = `"` + tc.text + `"`
			}
			for form, value := range forms {
				t.Run(tc.name+"/"+field+"/"+form, func(t *testing.T) {
					body := `{"account":"acct-1","amount_cents":2500,"` + field + `":` + value + `}`
					if field == "account" {
						body = `{"account":` + value + `,"amount_cents":2500}`
					}
					r, err := lab.ParseChargeRequest(strings.NewReader(body))
					if tc.want == "" {
						got := r.Account
						if field == "order_id" {
							got = r.OrderID
						}
						if err != nil || got != tc.text {
							t.Fatalf("%s: got %+v, %v; want %s %q", body, r, err, field, tc.text)
						}
						return
					}
					refused(t, err, field, tc.want)
				})
			}
		}
	}
}

// TestKeysAreNotNormalized: keys are compared byte for byte. é as one code
// point and as e + U+0301 are both printable, and stay two keys.
func TestKeysAreNotNormalized(t *testing.T) {
	composed, decomposed := "caf\u00e9", "cafe\u0301"
	for _, k := range []string{composed, decomposed} {
		key, _, err := lab.ParseKeyHeader([]string{k})
		if err != nil || key != k {
			t.Fatalf("%q: got %q, %v", k, key, err)
		}
	}
}
