package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
)

// badTexts are keys and accounts that look like something else, or like
// nothing: each must be refused, on every store, before anything is charged.
var badTexts = []struct{ name, text, char string }{
	{"OnlyZeroWidthSpace", "\u200b", "U+200B"},
	{"RightToLeftOverride", "kt-\u202e1", "U+202E"},
	{"TrailingNoBreakSpace", "kt-1\u00a0", "U+00A0"},
	{"LeadingNoBreakSpace", "\u00a0kt-1", "U+00A0"},
	{"OnlySpaces", "   ", "U+0020"},
	{"OnlyIdeographicSpace", "\u3000", "U+3000"},
	{"ByteOrderMark", "\ufeffkt-1", "U+FEFF"},
	{"SoftHyphen", "kt\u00ad1", "U+00AD"},
	{"LeftToRightIsolate", "kt-\u20661", "U+2066"},
	{"HangulFiller", "\u3164", "U+3164"},
}

func jsonText(t *testing.T, s string) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wantTextRefused checks a 400 invalid_parameter problem naming param, the
// rule of printable text and the offending character.
func wantTextRefused(t *testing.T, r labtest.Reply, param, char string) {
	t.Helper()
	if r.Status != http.StatusBadRequest || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/problem+json") {
		t.Fatalf("got %d %s %s; want a 400 problem", r.Status, r.Header.Get("Content-Type"), r.Body)
	}
	p := labtest.Decode[lab.Problem](t, r)
	if p.Code != "invalid_parameter" || p.Param != param || !strings.Contains(p.Detail, param+": must be 1..") || !strings.Contains(p.Detail, " bytes of printable text: ") ||
		!strings.Contains(p.Detail, char) || !strings.Contains(p.Detail, "printable text is valid UTF-8") {
		t.Fatalf("got %+v; want invalid_parameter naming %s, the rule and %s", p, param, char)
	}
}

// TestKeyTextRefused: a key or an account holding an invisible, bidi or
// format character, or whitespace at either end, is a 400 naming the
// parameter on every idempotent store, and the ledger holds no charge for it.
func TestKeyTextRefused(t *testing.T) {
	t.Parallel()
	for _, store := range idempotentStores {
		t.Run(string(store), func(t *testing.T) {
			t.Parallel()
			a := labtest.Start(t, e2e.StoreConfig(t, store))
			for i, tc := range badTexts {
				r := labtest.Charge(t, a.URL(), store, labtest.Acme, tc.text, e2e.Body2500)
				if strings.Trim(tc.text, " \t") == "" { // HTTP's optional white space: the field arrives empty
					if p := labtest.Decode[lab.Problem](t, r); r.Status != http.StatusBadRequest || p.Param != lab.KeyHeader {
						t.Fatalf("%s: %d %s; want a 400 naming %s", tc.name, r.Status, r.Body, lab.KeyHeader)
					}
				} else {
					wantTextRefused(t, r, lab.KeyHeader, tc.char)
				}
				if r.Header.Get(lab.KeyHeader) != "" {
					t.Errorf("%s: a refused key is echoed: %q", tc.name, r.Header.Get(lab.KeyHeader))
				}
				if n := e2e.KeyCharges(t, a, "acme", store, tc.text); n != 0 {
					t.Errorf("%s: the refused key %q charged %d times", tc.name, tc.text, n)
				}

				key := fmt.Sprintf("kt-%s-account-%d", store, i)
				body := `{"account":` + jsonText(t, tc.text) + `,"amount_cents":2500}`
				wantTextRefused(t, labtest.Charge(t, a.URL(), store, labtest.Acme, key, body), "account", tc.char)
				key = fmt.Sprintf("kt-%s-order-%d", store, i)
				body = `{"account":"acct-1","amount_cents":2500,"order_id":` + jsonText(t, tc.text) + `}`
				wantTextRefused(t, labtest.Charge(t, a.URL(), store, labtest.Acme, key, body), "order_id", tc.char)
				for _, k := range []string{fmt.Sprintf("kt-%s-account-%d", store, i), key} {
					if n := e2e.KeyCharges(t, a, "acme", store, k); n != 0 {
						t.Errorf("%s: %s charged %d times for a refused body", tc.name, k, n)
					}
				}
			}
		})
	}
}

// TestKeyTextLookAlikes: `k` and `k` + U+00A0 are no longer two keys that
// look the same: the first charges, the second is refused, and the ledger
// holds the one charge. Keys are not normalized either: é as one code point
// and as e + U+0301 are two keys, each charged once.
func TestKeyTextLookAlikes(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, memory.Name))
	if r := labtest.Charge(t, a.URL(), memory.Name, labtest.Acme, "kt-k", e2e.Body2500); r.Status != http.StatusCreated {
		t.Fatalf("kt-k: %d %s", r.Status, r.Body)
	}
	wantTextRefused(t, labtest.Charge(t, a.URL(), memory.Name, labtest.Acme, "kt-k\u00a0", e2e.Body2500), lab.KeyHeader, "U+00A0")
	if n := e2e.KeyCharges(t, a, "acme", memory.Name, "kt-k"); n != 1 {
		t.Fatalf("kt-k charged %d times, want 1", n)
	}

	for _, key := range []string{"kt-caf\u00e9", "kt-cafe\u0301"} {
		r := labtest.Charge(t, a.URL(), memory.Name, labtest.Acme, key, e2e.Body2500)
		if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") == "true" {
			t.Fatalf("%q: %d replayed %q; want a charge of its own", key, r.Status, r.Header.Get("Idempotent-Replayed"))
		}
		if n := e2e.KeyCharges(t, a, "acme", memory.Name, key); n != 1 {
			t.Fatalf("%q charged %d times, want 1", key, n)
		}
	}

	// Ordinary keys and accounts of any script still charge.
	for i, key := range []string{"order-4711", "ordre-été", "注文-1", "a b", "🧾-1", "\u2764\ufe0f"} {
		body := `{"account":` + jsonText(t, []string{"acct-1", "compte-été", "口座 1"}[i%3]) + `,"amount_cents":2500}`
		if r := labtest.Charge(t, a.URL(), memory.Name, labtest.Acme, key, body); r.Status != http.StatusCreated {
			t.Fatalf("%q: %d %s", key, r.Status, r.Body)
		}
	}
}

// TestKeyTextOtherRoutes: the lab runs' key and account, the Lab-Run header
// and the operation route's key follow the same rule.
func TestKeyTextOtherRoutes(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, postgres.Name))
	get := func(path string) labtest.Reply {
		return labtest.Do(t, http.MethodGet, a.URL()+path, labtest.Bearer(labtest.Acme), "")
	}
	wantTextRefused(t, get("/charge-idempotent?key=%E2%80%8B"), "key", "U+200B")
	wantTextRefused(t, get("/charge-idempotent?store=postgres&key=kt-1%C2%A0"), "key", "U+00A0")
	wantTextRefused(t, get("/charge-idempotent?key=kt-run&account=acct%E2%81%A6-1"), "account", "U+2066")
	wantTextRefused(t, get("/charge-idempotent?key=kt-run&order_id=+++"), "order_id", "U+0020")
	if n := e2e.KeyCharges(t, a, "acme", memory.Name, "kt-run"); n != 0 {
		t.Fatalf("a refused run charged kt-run %d times", n)
	}
	wantTextRefused(t, get("/operations/%E2%80%AEkt?store=lease"), "key", "U+202E")

	h := http.Header{"Authorization": {"Bearer " + labtest.Acme}, lab.KeyHeader: {"kt-lab-run"},
		"Content-Type": {"application/json"}, "Lab-Run": {"run-\u202e1"}}
	wantTextRefused(t, labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=postgres", h, e2e.Body2500), "Lab-Run", "U+202E")
	if n := e2e.KeyCharges(t, a, "acme", postgres.Name, "kt-lab-run"); n != 0 {
		t.Fatalf("a refused Lab-Run charged %d times", n)
	}
}
