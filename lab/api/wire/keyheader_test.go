package wire_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
)

func TestParseKeyHeader(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []string
		key   string // "" when refused
	}{
		{"Quoted", []string{`"sf-1"`}, "sf-1"},
		{"Bare", []string{"sf-1"}, "sf-1"},
		{"QuotedWithSpaces", []string{` "order 9" `}, "order 9"},
		{"Escaped", []string{`"a\"b\\c"`}, `a"b\c`},
		{"BareUnicode", []string{"pedido-ñ"}, "pedido-ñ"},
		{"Empty", []string{""}, ""},
		{"EmptyQuoted", []string{`""`}, ""},
		{"TwoFields", []string{"a", "b"}, ""},
		{"Unclosed", []string{`"abc`}, ""},
		{"AfterClosingQuote", []string{`"abc"x`}, ""},
		{"BadEscape", []string{`"a\nb"`}, ""},
		{"QuoteInBare", []string{`ab"c`}, ""},
		{"NonASCIIQuoted", []string{`"ñ"`}, ""},
		{"Over255Bytes", []string{strings.Repeat("k", 256)}, ""},
		{"Exactly255Bytes", []string{strings.Repeat("k", 255)}, strings.Repeat("k", 255)},
		{"Over255QuotedBytes", []string{`"` + strings.Repeat("k", 256) + `"`}, ""},
		{"Control", []string{"a\x01b"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, present, err := wire.ParseKeyHeader(tc.lines)
			if !present {
				t.Fatal("a field was sent: present must be true")
			}
			if tc.key == "" {
				var ie *lab.InvalidError
				if !errors.As(err, &ie) || ie.Param != lab.KeyHeader {
					t.Fatalf("got key %q, err %v: want a 400 naming %s", key, err, lab.KeyHeader)
				}
				return
			}
			if err != nil || key != tc.key {
				t.Fatalf("got %q, %v; want %q", key, err, tc.key)
			}
			if back, _, err := wire.ParseKeyHeader([]string{wire.FormatKeyHeader(key)}); err != nil || back != key {
				t.Fatalf("echo %q reads back as %q, %v", wire.FormatKeyHeader(key), back, err)
			}
		})
	}
	if _, present, err := wire.ParseKeyHeader(nil); present || err != nil {
		t.Fatalf("no field: present %v, err %v", present, err)
	}
}
