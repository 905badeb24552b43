package wire_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
)

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

func TestParseInt(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		present   bool
		want      int64
		reason    string // "" when valid
	}{
		{"Absent", "", false, 20, ""},
		{"Plain", "5", true, 5, ""},
		{"Lowest", "1", true, 1, ""},
		{"Highest", "200", true, 200, ""},
		{"Empty", "", true, 0, "must not be empty"},
		{"LeadingPlus", "+5", true, 0, "1..200"},
		{"LeadingSpace", " 5", true, 0, "1..200"},
		{"TrailingSpace", "5 ", true, 0, "1..200"},
		{"LeadingZero", "05", true, 0, "1..200"},
		{"NegativeZero", "-0", true, 0, "1..200"},
		{"Negative", "-5", true, 0, "1..200"},
		{"Zero", "0", true, 0, "1..200"},
		{"AboveRange", "201", true, 0, "1..200"},
		{"Hex", "0x10", true, 0, "1..200"},
		{"Octal", "0o10", true, 0, "1..200"},
		{"Exponent", "1e2", true, 0, "1..200"},
		{"Fraction", "5.0", true, 0, "1..200"},
		{"Underscore", "1_0", true, 0, "1..200"},
		{"ArabicIndicDigit", "٣", true, 0, "1..200"},
		{"FullwidthDigit", "５", true, 0, "1..200"},
		{"Overflow", "9223372036854775808", true, 0, "1..200"},
		{"Word", "abc", true, 0, "1..200"},
		{"NUL", "5\x00", true, 0, "1..200"},
		{"InvalidUTF8", "\xff", true, 0, "1..200"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := wire.ParseInt("limit", tc.raw, tc.present, 20, 1, 200)
			if tc.reason != "" {
				wantInvalid(t, err, "limit", tc.reason)
				return
			}
			if err != nil || n != tc.want {
				t.Fatalf("got %d, %v; want %d", n, err, tc.want)
			}
		})
	}
}

func TestParseText(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		present   bool
		want      string // the value, or for a refused one a substring of the reason
		ok        bool
	}{
		{"Absent", "", false, "acct-1", true},
		{"Plain", "acct-2", true, "acct-2", true},
		{"Spaces", "a b", true, "a b", true},
		{"Unicode", "café 😀", true, "café 😀", true},
		{"Max", strings.Repeat("a", 64), true, strings.Repeat("a", 64), true},
		{"Empty", "", true, "must not be empty", false},
		{"TooLong", strings.Repeat("a", 65), true, "1..64", false},
		{"NUL", "\x00", true, "control", false},
		{"Newline", "a\nb", true, "control", false},
		{"Tab", "a\tb", true, "control", false},
		{"DEL", "a\x7f", true, "control", false},
		{"C1", "a\u0085", true, "control", false},
		{"InvalidUTF8", "\xff", true, "UTF-8", false},
		{"UTF8EncodedSurrogate", "\xed\xa0\x80", true, "UTF-8", false},
		{"TruncatedUTF8", "a\xe2\x82", true, "UTF-8", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := wire.ParseText("account", tc.raw, tc.present, "acct-1", lab.MaxAccountBytes)
			if !tc.ok {
				wantInvalid(t, err, "account", tc.want)
				return
			}
			if err != nil || v != tc.want {
				t.Fatalf("got %q, %v; want %q", v, err, tc.want)
			}
		})
	}
}

func TestParseName(t *testing.T) {
	for _, ok := range []string{"memory", "crash_after_claim", "a", "x-1+y", strings.Repeat("a", wire.MaxNameBytes)} {
		if v, err := wire.ParseName("store", ok, true, "memory"); err != nil || v != ok {
			t.Errorf("ParseName(%q) = %q, %v", ok, v, err)
		}
	}
	if v, err := wire.ParseName("store", "", false, "memory"); err != nil || v != "memory" {
		t.Errorf("absent: %q, %v", v, err)
	}
	_, err := wire.ParseName("store", "", true, "memory")
	wantInvalid(t, err, "store", "must not be empty")
	// A space is a '+' the query did not encode: redis+postgres typed in a shell.
	if v, err := wire.ParseName("store", "redis postgres", true, "memory"); err != nil || v != "redis+postgres" {
		t.Errorf("an unencoded '+': %q, %v", v, err)
	}
	for _, bad := range []string{"Memory", "1st", "-x", " a", "a.b", "mem\x00", "\xff", "ﬁ", strings.Repeat("a", wire.MaxNameBytes+1)} {
		_, err := wire.ParseName("store", bad, true, "memory")
		wantInvalid(t, err, "store", "lowercase letter")
	}
}

func TestParseChoice(t *testing.T) {
	formats := []string{"json", "markdown", "table"}
	if v, err := wire.ParseChoice("format", "table", true, "json", formats...); err != nil || v != "table" {
		t.Fatalf("table: %q, %v", v, err)
	}
	if v, err := wire.ParseChoice("format", "", false, "json", formats...); err != nil || v != "json" {
		t.Fatalf("absent: %q, %v", v, err)
	}
	_, err := wire.ParseChoice("format", "xml", true, "json", formats...)
	wantInvalid(t, err, "format", "must be one of json, markdown, table")
	_, err = wire.ParseChoice("format", "", true, "json", formats...)
	wantInvalid(t, err, "format", "must not be empty")
}

// TestQuery covers the findings: values that reached PostgreSQL and gave
// 500 (SQLSTATE 22021) are 400s naming the parameter, before any store.
func TestQuery(t *testing.T) {
	text := func(name, def string, max int) func(wire.Query) error {
		return func(q wire.Query) error { _, err := q.Text(name, def, max); return err }
	}
	for _, tc := range []struct {
		name, query string
		check       func(wire.Query) error
		param, want string // "" when valid
	}{
		{"StateAccountNUL", "account=%00", text("account", "acct-1", lab.MaxAccountBytes), "account", "control"},
		{"StateAccountInvalidUTF8", "account=%ff", text("account", "acct-1", lab.MaxAccountBytes), "account", "UTF-8"},
		{"StateKeyNUL", "store=postgres&key=%00", text("key", "", lab.MaxKeyBytes), "key", "control"},
		{"KeyEmpty", "key=", text("key", "order-4711", lab.MaxKeyBytes), "key", "must not be empty"},
		{"KeyTooLong", "key=" + strings.Repeat("x", 256), text("key", "order-4711", lab.MaxKeyBytes), "key", "1..255"},
		{"KeyRepeated", "key=a&key=b", text("key", "order-4711", lab.MaxKeyBytes), "key", "at most once"},
		{"KeyAbsent", "limit=5", text("key", "order-4711", lab.MaxKeyBytes), "", ""},
		{"AccountPlusIsSpace", "account=a+b", text("account", "acct-1", lab.MaxAccountBytes), "", ""},
		{"LimitPlus", "limit=%2B5", func(q wire.Query) error { _, err := q.Int("limit", 20, 1, 200); return err }, "limit", "1..200"},
		{"LimitSpace", "limit=+5", func(q wire.Query) error { _, err := q.Int("limit", 20, 1, 200); return err }, "limit", "1..200"},
		{"LimitEmpty", "limit=", func(q wire.Query) error { _, err := q.Int("limit", 20, 1, 200); return err }, "limit", "must not be empty"},
		{"StoreUpper", "store=Memory", func(q wire.Query) error { _, err := q.Name("store", "memory"); return err }, "store", "lowercase"},
		{"FormatUnknown", "format=xml", func(q wire.Query) error {
			_, err := q.Choice("format", "json", "json", "markdown", "table")
			return err
		}, "format", "one of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := wire.ParseQuery(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			err = tc.check(q)
			if tc.param == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantInvalid(t, err, tc.param, tc.want)
		})
	}
	for _, bad := range []string{"account=%zz", "account=%f", "a=1;b=2", "key=%"} {
		_, err := wire.ParseQuery(bad)
		wantInvalid(t, err, "query", "malformed")
	}
	q, _ := wire.ParseQuery("account=%C3%A9")
	if v, err := q.Text("account", "", 64); v != "é" || err != nil {
		t.Fatalf("percent-encoded UTF-8: %q, %v", v, err)
	}
}
