package lab_test

import (
	"errors"
	"strings"
	"testing"

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

// wantInvalid fails unless err is an *InvalidError naming param whose reason
// holds want.
func wantInvalid(t *testing.T, err error, param, want string) {
	t.Helper()
	var ie *lab.InvalidError
	if !errors.As(err, &ie) {
		t.Fatalf("got %v (%T); want an *InvalidError naming %q", err, err, param)
	}
	if ie.Param != param || !strings.Contains(ie.Reason, want) {
		t.Fatalf("got param %q reason %q; want param %q reason containing %q", ie.Param, ie.Reason, param, want)
	}
}
