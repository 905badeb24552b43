package wire_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
)

func TestFingerprintIgnoresOrderAndDefaults(t *testing.T) {
	a, err := wire.ParseChargeRequest(strings.NewReader(`{"account":"a","amount_cents":5,"currency":"USD"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := wire.ParseChargeRequest(strings.NewReader(" {\n\"amount_cents\": 5, \"account\": \"a\", \"currency\":\"usd\"}"))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := wire.ParseChargeRequest(strings.NewReader(`{"account":"a","amount_cents":6}`))
	if a.Fingerprint() != b.Fingerprint() {
		t.Fatal("same request, different fingerprints")
	}
	if a.Fingerprint() == c.Fingerprint() {
		t.Fatal("different amounts, same fingerprint")
	}
	d, _ := wire.ParseChargeRequest(strings.NewReader(`{"account":"a","amount_cents":5,"order_id":"o-1"}`))
	if a.Fingerprint() == d.Fingerprint() {
		t.Fatal("order id not in the fingerprint")
	}
}

// chargeCase is one body of POST /charges and what ParseChargeRequest makes
// of it: a request, or an *InvalidError naming param with reason holding want.
type chargeCase struct {
	name, body string
	param      string // "" for a valid body
	want       string // a substring of the reason; for a valid body, unused
	req        lab.ChargeRequest
}

const okBody = `{"account":"acct-1","amount_cents":2500}`

var okReq = lab.ChargeRequest{Account: "acct-1", AmountCents: 2500, Currency: "USD"}

func chargeCases() []chargeCase {
	pad := func(n int) string { // okBody padded with spaces to n bytes
		return okBody + strings.Repeat(" ", n-len(okBody))
	}
	return []chargeCase{
		// Valid bodies.
		{name: "Minimal", body: okBody, req: okReq},
		{name: "AllFields", body: `{"order_id":"o-1","currency":"eur","amount_cents":1,"account":"a"}`,
			req: lab.ChargeRequest{Account: "a", AmountCents: 1, Currency: "EUR", OrderID: "o-1"}},
		{name: "Whitespace", body: " \t\r\n" + okBody + " \t\r\n", req: okReq},
		{name: "MaxAmount", body: `{"account":"a","amount_cents":10000000}`, req: lab.ChargeRequest{Account: "a", AmountCents: 10_000_000, Currency: "USD"}},
		{name: "UnicodeAccount", body: `{"account":"café \ud83d\ude00","amount_cents":2500}`,
			req: lab.ChargeRequest{Account: "café 😀", AmountCents: 2500, Currency: "USD"}},
		{name: "EscapedBackslashBeforeU", body: `{"account":"a\\ud800","amount_cents":2500}`,
			req: lab.ChargeRequest{Account: `a\ud800`, AmountCents: 2500, Currency: "USD"}},
		{name: "ExactlyMaxBytes", body: pad(wire.MaxBodyBytes), req: okReq},

		// Trailing data after the object.
		{name: "TrailingBracket", body: okBody + `]`, param: "body", want: "exactly one JSON object"},
		{name: "TrailingBrace", body: okBody + `}`, param: "body", want: "exactly one JSON object"},
		{name: "TwoObjects", body: okBody + " " + okBody, param: "body", want: "exactly one JSON object"},
		{name: "TwoObjectsNoSpace", body: okBody + okBody, param: "body", want: "exactly one JSON object"},
		{name: "TrailingWord", body: okBody + ` x`, param: "body", want: "exactly one JSON object"},
		{name: "TrailingNUL", body: okBody + "\x00", param: "body", want: "exactly one JSON object"},
		{name: "TrailingNBSP", body: okBody + "\u00a0", param: "body", want: "exactly one JSON object"},
		{name: "TrailingComma", body: `{"account":"a","amount_cents":1,}`, param: "body", want: "JSON object"},

		// Numbers: plain JSON integers only.
		{name: "StringAmount", body: `{"account":"a","amount_cents":"2500"}`, param: "amount_cents", want: "JSON number, got a string"},
		{name: "FractionZero", body: `{"account":"a","amount_cents":2500.0}`, param: "amount_cents", want: "no fraction or exponent"},
		{name: "Fraction", body: `{"account":"a","amount_cents":25.5}`, param: "amount_cents", want: "no fraction or exponent"},
		{name: "Exponent", body: `{"account":"a","amount_cents":2.5e3}`, param: "amount_cents", want: "no fraction or exponent"},
		{name: "ExponentUpper", body: `{"account":"a","amount_cents":25E2}`, param: "amount_cents", want: "no fraction or exponent"},
		{name: "ExponentZero", body: `{"account":"a","amount_cents":2500e0}`, param: "amount_cents", want: "no fraction or exponent"},
		{name: "NegativeZero", body: `{"account":"a","amount_cents":-0}`, param: "amount_cents", want: "1..10000000"},
		{name: "Zero", body: `{"account":"a","amount_cents":0}`, param: "amount_cents", want: "1..10000000"},
		{name: "Negative", body: `{"account":"a","amount_cents":-5}`, param: "amount_cents", want: "1..10000000"},
		{name: "TooLargeAmount", body: `{"account":"a","amount_cents":10000001}`, param: "amount_cents", want: "1..10000000"},
		{name: "Overflow", body: `{"account":"a","amount_cents":9223372036854775808}`, param: "amount_cents", want: "1..10000000"},
		{name: "HugeOverflow", body: `{"account":"a","amount_cents":99999999999999999999999999999}`, param: "amount_cents", want: "1..10000000"},
		{name: "NegativeOverflow", body: `{"account":"a","amount_cents":-9223372036854775809}`, param: "amount_cents", want: "1..10000000"},
		{name: "LeadingPlus", body: `{"account":"a","amount_cents":+2500}`, param: "body", want: "JSON object"},
		{name: "LeadingZero", body: `{"account":"a","amount_cents":02500}`, param: "body", want: "JSON object"},
		{name: "Hex", body: `{"account":"a","amount_cents":0x9C4}`, param: "body", want: "JSON object"},
		{name: "NaN", body: `{"account":"a","amount_cents":NaN}`, param: "body", want: "JSON object"},
		{name: "BoolAmount", body: `{"account":"a","amount_cents":true}`, param: "amount_cents", want: "a boolean"},
		{name: "ArrayAmount", body: `{"account":"a","amount_cents":[2500]}`, param: "amount_cents", want: "an array"},
		{name: "ObjectAmount", body: `{"account":"a","amount_cents":{"v":2500}}`, param: "amount_cents", want: "an object"},
		{name: "MissingAmount", body: `{"account":"a"}`, param: "amount_cents", want: "is required"},

		// Duplicate keys.
		{name: "DuplicateAmount", body: `{"amount_cents":-5,"amount_cents":2500,"account":"a"}`, param: "amount_cents", want: "duplicate field"},
		{name: "DuplicateAccount", body: `{"account":"a","amount_cents":1,"account":"b"}`, param: "account", want: "duplicate field"},
		{name: "DuplicateEscapedKey", body: `{"account":"a","\u0061ccount":"b","amount_cents":1}`, param: "account", want: "duplicate field"},
		{name: "DuplicateNull", body: `{"order_id":"o","order_id":null,"account":"a","amount_cents":1}`, param: "order_id", want: "duplicate field"},
		{name: "DuplicateUnknown", body: `{"tip":1,"tip":1}`, param: "tip", want: "duplicate field"},

		// Invalid UTF-8 and unpaired surrogate escapes.
		{name: "InvalidUTF8InValue", body: "{\"account\":\"a\xffb\",\"amount_cents\":1}", param: "body", want: "UTF-8"},
		{name: "InvalidUTF8InKey", body: "{\"account\xff\":\"a\",\"amount_cents\":1}", param: "body", want: "UTF-8"},
		{name: "InvalidUTF8Trailing", body: okBody + "\xff", param: "body", want: "UTF-8"},
		{name: "OverlongUTF8", body: "{\"account\":\"\xc0\xaf\",\"amount_cents\":1}", param: "body", want: "UTF-8"},
		{name: "UTF8EncodedSurrogate", body: "{\"account\":\"\xed\xa0\x80\",\"amount_cents\":1}", param: "body", want: "UTF-8"},
		{name: "TruncatedUTF8", body: "{\"account\":\"\xe2\x82\",\"amount_cents\":1}", param: "body", want: "UTF-8"},
		{name: "LoneHighSurrogate", body: `{"account":"\ud800","amount_cents":1}`, param: "body", want: "surrogate"},
		{name: "LoneLowSurrogate", body: `{"account":"\udc00","amount_cents":1}`, param: "body", want: "surrogate"},
		{name: "HighThenLetter", body: `{"account":"\ud800\u0041","amount_cents":1}`, param: "body", want: "surrogate"},
		{name: "ReversedPair", body: `{"account":"\udc00\ud800","amount_cents":1}`, param: "body", want: "surrogate"},
		{name: "SurrogateInKey", body: `{"\ud800":1}`, param: "body", want: "surrogate"},

		// Explicit nulls and empty optional values.
		{name: "NullAccount", body: `{"account":null,"amount_cents":1}`, param: "account", want: "null"},
		{name: "NullOrderID", body: `{"account":"a","amount_cents":1,"order_id":null}`, param: "order_id", want: "null"},
		{name: "NullCurrency", body: `{"account":"a","amount_cents":1,"currency":null}`, param: "currency", want: "null"},
		{name: "NullAmount", body: `{"account":"a","amount_cents":null}`, param: "amount_cents", want: "null"},
		{name: "EmptyOrderID", body: `{"account":"a","amount_cents":1,"order_id":""}`, param: "order_id", want: "must not be empty"},
		{name: "EmptyCurrency", body: `{"account":"a","amount_cents":1,"currency":""}`, param: "currency", want: "must not be empty"},
		{name: "EmptyAccount", body: `{"account":"","amount_cents":1}`, param: "account", want: "is required"},
		{name: "MissingAccount", body: `{"amount_cents":100}`, param: "account", want: "is required"},

		// Not exactly one object.
		{name: "EmptyBody", body: ``, param: "body", want: "empty body"},
		{name: "OnlyWhitespace", body: " \n", param: "body", want: "empty body"},
		{name: "Null", body: `null`, param: "body", want: "got null"},
		{name: "Array", body: `[` + okBody + `]`, param: "body", want: "got an array"},
		{name: "String", body: `"x"`, param: "body", want: "got a string"},
		{name: "Number", body: `1`, param: "body", want: "got a number"},
		{name: "Truncated", body: `{"account":`, param: "body", want: "unexpected EOF"},
		{name: "Unclosed", body: `{"account":"a","amount_cents":1`, param: "body", want: "unexpected EOF"},
		{name: "ByteOrderMark", body: "\ufeff" + okBody, param: "body", want: "JSON object"},
		{name: "SingleQuotes", body: `{'account':'a'}`, param: "body", want: "JSON object"},
		{name: "Comment", body: `{"account":"a",/*x*/"amount_cents":1}`, param: "body", want: "JSON object"},

		// Fields and their bounds.
		{name: "UnknownField", body: `{"account":"a","amount_cents":1,"tip":5}`, param: "tip", want: "unknown field"},
		{name: "UnknownFieldCase", body: `{"Account":"a","amount_cents":1}`, param: "Account", want: "unknown field"},
		{name: "UnknownOddName", body: `{"a b\n":1}`, param: "body", want: `unknown field "a b\n"`},
		{name: "ObjectAccount", body: `{"account":{"id":"a"},"amount_cents":1}`, param: "account", want: "JSON string, got an object"},
		{name: "NumberAccount", body: `{"account":7,"amount_cents":1}`, param: "account", want: "JSON string, got a number"},
		{name: "ControlInAccount", body: `{"account":"a\u0000","amount_cents":1}`, param: "account", want: "control"},
		{name: "DELInOrderID", body: `{"account":"a","amount_cents":1,"order_id":"o\u007f"}`, param: "order_id", want: "control"},
		{name: "C1InAccount", body: `{"account":"a\u0085","amount_cents":1}`, param: "account", want: "control"},
		{name: "BidiInAccount", body: "{\"account\":\"acct\u2066-1\",\"amount_cents\":1}", param: "account", want: "bidi control U+2066"},
		{name: "EscapedBidiInAccount", body: `{"account":"acct\u202e-1","amount_cents":1}`, param: "account", want: "bidi control U+202E"},
		{name: "ZeroWidthOrderID", body: `{"account":"a","amount_cents":1,"order_id":"\u200b"}`, param: "order_id", want: "U+200B"},
		{name: "NBSPAfterAccount", body: "{\"account\":\"a\u00a0\",\"amount_cents\":1}", param: "account", want: "ends with whitespace U+00A0"},
		{name: "WhitespaceAccount", body: `{"account":"   ","amount_cents":1}`, param: "account", want: "only whitespace"},
		{name: "SoftHyphenInOrderID", body: `{"account":"a","amount_cents":1,"order_id":"o\u00ad1"}`, param: "order_id", want: "U+00AD"},
		{name: "LongAccount", body: `{"account":"` + strings.Repeat("a", 65) + `","amount_cents":1}`, param: "account", want: "1..64"},
		{name: "LongOrderID", body: `{"account":"a","amount_cents":1,"order_id":"` + strings.Repeat("o", 65) + `"}`, param: "order_id", want: "1..64"},
		{name: "ShortCurrency", body: `{"account":"a","amount_cents":1,"currency":"US"}`, param: "currency", want: "three letters"},
		{name: "DigitCurrency", body: `{"account":"a","amount_cents":1,"currency":"U5D"}`, param: "currency", want: "three letters"},
		{name: "LongSCurrency", body: `{"account":"a","amount_cents":1,"currency":"uſd"}`, param: "currency", want: "three letters"},
		{name: "DotlessICurrency", body: `{"account":"a","amount_cents":1,"currency":"ınr"}`, param: "currency", want: "three letters"},

		// Size.
		{name: "TooLarge", body: pad(wire.MaxBodyBytes + 1), param: "body", want: "too large"},
		{name: "TooLargeInvalid", body: okBody + strings.Repeat("x", wire.MaxBodyBytes), param: "body", want: "too large"},
	}
}

func TestParseChargeRequest(t *testing.T) {
	for _, tc := range chargeCases() {
		t.Run(tc.name, func(t *testing.T) {
			req, err := wire.ParseChargeRequest(strings.NewReader(tc.body))
			if tc.param == "" {
				if err != nil || req != tc.req {
					t.Fatalf("got %+v, %v; want %+v", req, err, tc.req)
				}
				return
			}
			var ie *lab.InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("got %+v, %v (%T); want an *InvalidError", req, err, err)
			}
			if ie.Param != tc.param || !strings.Contains(ie.Reason, tc.want) {
				t.Fatalf("got param %q reason %q; want param %q reason containing %q", ie.Param, ie.Reason, tc.param, tc.want)
			}
			if req != (lab.ChargeRequest{}) {
				t.Fatalf("a refused body returned %+v", req)
			}
		})
	}
}

type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }

func TestParseChargeRequestReadErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		body io.Reader
		want string
	}{
		{"NilBody", nil, "empty body"},
		{"ReadError", failingReader{errors.New("connection reset")}, "could not be read"},
		{"MaxBytesReader", http.MaxBytesReader(nil, io.NopCloser(strings.NewReader(okBody)), 10), "too large"},
		{"PartialThenError", io.MultiReader(strings.NewReader(okBody), failingReader{io.ErrUnexpectedEOF}), "could not be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := wire.ParseChargeRequest(tc.body)
			var ie *lab.InvalidError
			if !errors.As(err, &ie) || ie.Param != "body" || !strings.Contains(ie.Reason, tc.want) {
				t.Fatalf("got %v; want body: …%s…", err, tc.want)
			}
		})
	}
}
