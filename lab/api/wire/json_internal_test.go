package wire

import (
	"bytes"
	"testing"
	"unicode/utf8"
)

// plainBodies are bodies the plain reader accepts, and some it leaves to
// the general decoder.
var plainBodies = []struct {
	body  string
	plain bool
}{
	{`{"account":"acct-1","amount_cents":2500}`, true},
	{` { "account" : "acct-1" , "amount_cents" : 2500 , "currency" : "USD" , "order_id" : "o-1" } ` + "\n", true},
	{`{}`, true},
	{`{"amount_cents":-0}`, true},
	{`{"account":"naïve"}`, true},
	{`{"amount_cents":2500.0}`, false},
	{`{"amount_cents":1e3}`, false},
	{`{"amount_cents":012}`, false},
	{`{"account":"a\"b"}`, false},
	{`{"account":"a\u0041"}`, false},
	{`{"account":null}`, false},
	{`{"account":true}`, false},
	{`{"account":{"x":1}}`, false},
	{`{"account":"a","account":"b"}`, false},
	{`{"account":"a",}`, false},
	{`{"account":"a"}{}`, false},
	{`{"account":"a"`, false},
	{"{\"account\":\"a\tb\"}", false},
	{`[]`, false},
	{``, false},
}

func TestPlainObjectReadsWhatTheDecoderReads(t *testing.T) {
	for _, tc := range plainBodies {
		fields, ok := splitPlainObject([]byte(tc.body))
		if ok != tc.plain {
			t.Errorf("%q: plain %v, want %v", tc.body, ok, tc.plain)
		}
		if ok {
			agree(t, []byte(tc.body), fields)
		}
	}
}

// FuzzPlainObject: whatever valid UTF-8 the plain reader accepts, the general decoder
// accepts too, with the same members in the same order.
func FuzzPlainObject(f *testing.F) {
	for _, tc := range plainBodies {
		f.Add([]byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !utf8.Valid(body) {
			return // ParseChargeRequest refuses it before either reader sees it
		}
		if fields, ok := splitPlainObject(body); ok {
			agree(t, body, fields)
		}
	})
}

func agree(t *testing.T, body []byte, plain []field) {
	t.Helper()
	general, err := splitObject(body)
	if err != nil {
		t.Fatalf("%q: the plain reader accepted what the decoder refuses: %v", body, err)
	}
	if len(general) != len(plain) {
		t.Fatalf("%q: %d members, the decoder %d", body, len(plain), len(general))
	}
	for i := range plain {
		if plain[i].name != general[i].name || !bytes.Equal(plain[i].value, general[i].value) {
			t.Fatalf("%q: member %d is %s=%s, the decoder reads %s=%s", body, i, plain[i].name, plain[i].value, general[i].name, general[i].value)
		}
	}
}
