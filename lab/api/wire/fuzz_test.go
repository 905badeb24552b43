package wire_test

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// The fuzz targets below share one property: every input is either valid,
// and then within its bounds and stable under re-encoding, or refused with
// an *InvalidError naming a parameter; never a panic, never another error.
// Seeds live in testdata/fuzz/<FuzzName>/ as well as in f.Add.
//
// Bounded runs, one target at a time:
//
//	go test -run '^$' -fuzz '^FuzzParseChargeRequest$' -fuzztime 20s ./lab/api/wire/

// printable is the lab's rule for printable text, written here apart from
// lab.CheckText: 1..max bytes of UTF-8 with no control character (Cc), line
// or paragraph separator (Zl, Zp), format character (Cf) or other
// default-ignorable character, and no white space at either end.
func printable(s string, max int) bool {
	if s == "" || len(s) > max || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.In(r, unicode.Cc, unicode.Zl, unicode.Zp, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point) {
			return false
		}
	}
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	return !unicode.IsSpace(first) && !unicode.IsSpace(last)
}

func checkRequest(t *testing.T, r lab.ChargeRequest) {
	t.Helper()
	if !printable(r.Account, lab.MaxAccountBytes) {
		t.Fatalf("account %q out of bounds", r.Account)
	}
	if r.OrderID != "" && !printable(r.OrderID, lab.MaxOrderIDBytes) {
		t.Fatalf("order_id %q out of bounds", r.OrderID)
	}
	if r.AmountCents < 1 || r.AmountCents > lab.MaxAmountCents {
		t.Fatalf("amount_cents %d out of bounds", r.AmountCents)
	}
	if len(r.Currency) != 3 || strings.Trim(r.Currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
		t.Fatalf("currency %q is not three upper-case letters", r.Currency)
	}
}

func FuzzParseChargeRequest(f *testing.F) {
	for _, tc := range chargeCases() {
		if len(tc.body) < 4<<10 {
			f.Add([]byte(tc.body))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := wire.ParseChargeRequest(bytes.NewReader(body))
		if err != nil {
			labtest.WantInvalid(t, err, "")
			return
		}
		checkRequest(t, r)
		if !utf8.Valid(body) || !json.Valid(body) {
			t.Fatalf("accepted a body that is not valid UTF-8 JSON: %q", body)
		}
		// encoding/json reads the same values (the strict decoder accepts a
		// subset of what it accepts, and never reads them differently).
		var loose struct {
			Account     *string `json:"account"`
			AmountCents *int64  `json:"amount_cents"`
			Currency    *string `json:"currency"`
			OrderID     *string `json:"order_id"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&loose); err != nil {
			t.Fatalf("encoding/json refuses an accepted body: %v", err)
		}
		currency, orderID := lab.DefaultCurrency, ""
		if loose.Currency != nil {
			currency = strings.ToUpper(*loose.Currency)
		}
		if loose.OrderID != nil {
			orderID = *loose.OrderID
		}
		if loose.Account == nil || *loose.Account != r.Account || loose.AmountCents == nil || *loose.AmountCents != r.AmountCents ||
			currency != r.Currency || orderID != r.OrderID {
			t.Fatalf("encoding/json reads %+v, the strict decoder %+v", loose, r)
		}
		// Re-encoding gives the same request and the same fingerprint.
		enc, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		again, err := wire.ParseChargeRequest(bytes.NewReader(enc))
		if err != nil || again != r || again.Fingerprint() != r.Fingerprint() {
			t.Fatalf("re-encoded %s parses to %+v, %v; want %+v", enc, again, err, r)
		}
		if n, err := r.Normalize(); err != nil || n != r {
			t.Fatalf("Normalize is not idempotent: %+v, %v", n, err)
		}
	})
}

func FuzzParseInt(f *testing.F) {
	for _, s := range []string{"", "5", "+5", " 5", "5 ", "05", "-0", "-5", "0x10", "1e3", "5.0", "1_000", "٣",
		"9223372036854775807", "9223372036854775808", "-9223372036854775808", "abc", "\x00", "\xff"} {
		f.Add(s, true, int64(1), int64(200))
		f.Add(s, false, int64(1), int64(64))
	}
	f.Fuzz(func(t *testing.T, raw string, present bool, lo, hi int64) {
		const def = 7
		n, err := wire.ParseInt("p", raw, present, def, lo, hi)
		switch {
		case err != nil:
			labtest.WantInvalid(t, err, "p")
			if !strings.Contains(err.Error(), "..") {
				t.Fatalf("%v does not name the range", err)
			}
		case !present:
			if n != def {
				t.Fatalf("absent: got %d, want the default", n)
			}
		case n < lo || n > hi || strconv.FormatInt(n, 10) != raw:
			t.Fatalf("accepted %q as %d (range %d..%d)", raw, n, lo, hi)
		}
	})
}

func FuzzParseText(f *testing.F) {
	for _, s := range []string{"", "order-4711", "a b", "café", "\x00", "\xff", "a\nb", "a\x7f", "a\u0085", "\xed\xa0\x80",
		strings.Repeat("k", 255), strings.Repeat("k", 256), "\u200b", "abc\u202edef", "k\u00a0", "\u00a0k", "   ", "\u3000",
		"\ufeffk", "or\u00adder", "acct\u2066-1", "\u3164", "a\u2028b", " k", "k ", "a\u3000b", "\u2764\ufe0f", "e\u0301", `"k"`} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, raw string, present bool) {
		for _, max := range []int{lab.MaxAccountBytes, lab.MaxKeyBytes} {
			v, err := wire.ParseText("p", raw, present, "def", max)
			switch {
			case err != nil:
				labtest.WantInvalid(t, err, "p")
			case !present:
				if v != "def" {
					t.Fatalf("absent: got %q", v)
				}
			case v != raw || !printable(v, max):
				t.Fatalf("accepted %q as %q (max %d)", raw, v, max)
			}
			if present && err != nil && printable(raw, max) {
				t.Fatalf("refused printable text %q (max %d): %v", raw, max, err)
			}
			if max == lab.MaxKeyBytes && present {
				// The query's key and the Idempotency-Key header agree.
				if kerr := lab.ValidateKey(raw); (kerr == nil) != (err == nil) {
					t.Fatalf("ParseText %v, ValidateKey %v", err, kerr)
				} else if kerr != nil {
					labtest.WantInvalid(t, kerr, "Idempotency-Key")
				}
				// And so does the header's bare form, when it is one: no
				// quote or backslash, no optional white space around it.
				if !strings.ContainsAny(raw, `"\`) && strings.Trim(raw, " \t") == raw {
					key, _, herr := wire.ParseKeyHeader([]string{raw})
					if (herr == nil) != (err == nil) || herr == nil && key != raw {
						t.Fatalf("ParseText %v, ParseKeyHeader %q, %v", err, key, herr)
					} else if herr != nil {
						labtest.WantInvalid(t, herr, lab.KeyHeader)
					}
				}
			}
		}
	})
}

func FuzzParseName(f *testing.F) {
	for _, s := range []string{"", "memory", "crash_after_claim", "x+y", "Memory", "1st", "a b", "a\x00", "\xff", "ﬁ", "json",
		strings.Repeat("a", 33)} {
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, raw string, present bool) {
		v, err := wire.ParseName("p", raw, present, "def")
		switch {
		case err != nil:
			labtest.WantInvalid(t, err, "p")
		case !present:
			if v != "def" {
				t.Fatalf("absent: got %q", v)
			}
		case v != strings.ReplaceAll(raw, " ", "+") || v == "" || len(v) > wire.MaxNameBytes || v[0] < 'a' || v[0] > 'z' ||
			strings.Trim(v, "abcdefghijklmnopqrstuvwxyz0123456789_-+") != "":
			t.Fatalf("accepted %q as %q", raw, v)
		}
		allowed := []string{"json", "markdown", "table"}
		c, err := wire.ParseChoice("p", raw, present, "json", allowed...)
		switch {
		case err != nil:
			labtest.WantInvalid(t, err, "p")
		case !slices.Contains(allowed, c) || present && c != strings.ReplaceAll(raw, " ", "+"):
			t.Fatalf("ParseChoice accepted %q as %q", raw, c)
		}
	})
}

// FuzzQuery runs every lab route's query parameters through the parsers.
func FuzzQuery(f *testing.F) {
	for _, s := range []string{"", "account=%00", "account=%ff", "key=%00", "store=postgres&key=%00", "key=", "key=a&key=b",
		"limit=%2B5", "limit=+5", "limit=5", "a=%zz", "a=1;b=2", "attempts=5&amount=2500&replicas=1&fault=slow&work_ms=300&ttl_ms=100",
		"account=a+b", "format=markdown", "scope=local", "%=", "=", "&&", "key=%E2%82", "key=%E2%80%8B", "key=k%C2%A0", "key=+++",
		"account=acct%E2%81%A6-1", "order_id=%EF%BB%BFo"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := wire.ParseQuery(raw)
		if err != nil {
			labtest.WantInvalid(t, err, "query")
			return
		}
		check := func(name string, v any, err error) {
			t.Helper()
			if err != nil {
				labtest.WantInvalid(t, err, name)
				return
			}
			if s, ok := v.(string); ok && !utf8.ValidString(s) {
				t.Fatalf("%s=%q accepted", name, s)
			}
		}
		text := func(name string, v string, err error) {
			t.Helper()
			check(name, v, err)
			if err == nil && v != "def" && !printable(v, lab.MaxKeyBytes) {
				t.Fatalf("%s=%q accepted: not printable text", name, v)
			}
		}
		for _, name := range []string{"key", "account", "order_id", "tenant", "other_tenant"} {
			v, err := q.Text(name, "def", lab.MaxKeyBytes)
			text(name, v, err)
		}
		for _, name := range []string{"store", "scenario", "fault"} {
			v, err := q.Name(name, "def")
			check(name, v, err)
		}
		v, err := q.Choice("format", "json", "json", "markdown", "table")
		check("format", v, err)
		for _, name := range []string{"attempts", "amount", "replicas", "limit", "ttl_ms", "work_ms", "window_ms"} {
			n, err := q.Int(name, 1, 1, 60_000)
			check(name, n, err)
			if err == nil && (n < 1 || n > 60_000) {
				t.Fatalf("%s=%d accepted", name, n)
			}
		}
	})
}
