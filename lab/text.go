package lab

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Printable text is what the lab accepts for the strings that name things:
// the Idempotency-Key (header, query and route), accounts, order ids, runs,
// join codes, tokens. It is valid UTF-8 with no control characters (C0,
// DEL, C1), no line or paragraph separators (U+2028, U+2029), no format
// characters (Unicode category Cf: the bidi controls, zero-width
// characters, U+FEFF, the soft hyphen…), no other invisible characters
// Unicode marks default-ignorable (the Hangul fillers, U+034F), and no
// whitespace at its start or end, so none that is only whitespace. Spaces
// inside are allowed. Nothing is normalized: two strings are the same text
// when they hold the same bytes, as they are the same key in every store.
//
// Every Cf is refused, the joiners too: emoji sequences joined by U+200D
// and words written with U+200C are refused with them. These strings name
// things, and a character that shows nothing lets two that look the same
// differ.
//
// textRule says it in the words of an error message.
const textRule = "printable text is valid UTF-8 without control, format (Cf) or other invisible characters, and without whitespace at either end"

// CheckText checks that v is 1..max bytes of printable text; an error is an
// *InvalidError naming param, the rule and the offending character.
func CheckText(param, v string, max int) error {
	switch {
	case v == "":
		return Invalid(param, "must not be empty: 1..%d bytes of printable text", max)
	case len(v) > max:
		return Invalid(param, "is %d bytes; allowed 1..%d bytes", len(v), max)
	}
	return textError(param, v, max)
}

// textError is the *InvalidError naming param when v is not printable
// text, else nil; max is the bound it names. It leaves the empty string and
// the bounds to its caller.
func textError(param, v string, max int) error {
	if fault := textFault(v); fault != "" {
		return Invalid(param, "must be 1..%d bytes of printable text: %s; %s", max, fault, textRule)
	}
	return nil
}

// textFault says why s is not printable text, or "" when it is. Printable
// ASCII takes the fast path; other runes are decoded and classified.
func textFault(s string) string {
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f {
			i++
			continue
		}
		r, n := rune(c), 1
		if c >= utf8.RuneSelf {
			if r, n = utf8.DecodeRuneInString(s[i:]); r == utf8.RuneError && n == 1 {
				return fmt.Sprintf("it is not valid UTF-8 (invalid byte at offset %d)", i)
			}
		}
		if what := unprintable(r); what != "" {
			return fmt.Sprintf("it holds %s at byte %d", what, i)
		}
		i += n
	}
	if s == "" {
		return ""
	}
	first, _ := utf8.DecodeRuneInString(s)
	last, n := utf8.DecodeLastRuneInString(s)
	switch {
	case onlySpace(s):
		return fmt.Sprintf("it is only whitespace, beginning with %U", first)
	case unicode.IsSpace(first):
		return fmt.Sprintf("it starts with whitespace %U", first)
	case unicode.IsSpace(last):
		return fmt.Sprintf("it ends with whitespace %U at byte %d", last, len(s)-n)
	}
	return ""
}

// unprintable describes r when printable text must not hold it anywhere,
// else "".
func unprintable(r rune) string {
	switch {
	case r < 0x20 || r >= 0x7f && r < 0xa0:
		return fmt.Sprintf("control character %U", r)
	case r == '\u2028':
		return fmt.Sprintf("%U (a line separator)", r)
	case r == '\u2029':
		return fmt.Sprintf("%U (a paragraph separator)", r)
	case unicode.Is(unicode.Bidi_Control, r):
		return fmt.Sprintf("bidi control %U (a format character: invisible, it reorders the text around it)", r)
	case unicode.Is(unicode.Cf, r):
		return fmt.Sprintf("%U (a format character, invisible)", r)
	case unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r):
		return fmt.Sprintf("%U (invisible: Unicode marks it default-ignorable)", r)
	}
	return ""
}

func onlySpace(s string) bool {
	for _, r := range s {
		if !unicode.IsSpace(r) {
			return false
		}
	}
	return true
}
