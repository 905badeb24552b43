package history_test

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab/history"
)

var acme = history.Key{Tenant: "acme", Endpoint: "POST /charges", Key: "k"}

// charge is one try: attempt c from call to ret, told status with id.
func charge(c int, call, ret int64, status int, id string, replayed bool) history.Op {
	return history.Op{Kind: history.Charge, Client: c, CallUS: call, ReturnUS: ret, Key: acme, Fingerprint: "fp1",
		Status: status, ChargeID: id, Replayed: replayed}
}

func ledger(call, ret int64, ids ...string) history.Op {
	return history.Op{Kind: history.LedgerRead, CallUS: call, ReturnUS: ret, Key: acme, Charges: ids}
}

func check(t *testing.T, ops ...history.Op) history.Result {
	t.Helper()
	return history.Check(history.History{Run: "run_t", Ops: ops}, history.DefaultTimeout)
}

func TestHistories(t *testing.T) {
	t.Parallel()
	other := charge(3, 5, 30, 201, "ch_x", false)
	other.Fingerprint = "fp2"
	refused := charge(3, 5, 30, 422, "", false)
	refused.Fingerprint = "fp2"
	globex := charge(2, 0, 10, 201, "ch_g", false)
	globex.Key.Tenant = "globex"
	before := ledger(0, 1, "ch_old")
	before.Before = true
	for _, tc := range []struct {
		name string
		ops  []history.Op
		want history.Verdict
		why  string // a pattern the sentence must match, for a violation
	}{
		{"OneChargeAndReplays", []history.Op{charge(1, 0, 10, 201, "ch_a", false), charge(2, 1, 12, 201, "ch_a", true),
			charge(3, 2, 11, 201, "ch_a", true), ledger(20, 21, "ch_a")}, history.Linearizable, ""},
		{"TwoChargesAnswered", []history.Op{charge(1, 0, 10, 201, "ch_a", false), charge(2, 1, 12, 201, "ch_b", false)},
			history.Violation, `attempt 1 was told ch_a, attempt 2 was told ch_b — 2 charges for one key`},
		{"ReplayBeforeAnyChargeEnded", []history.Op{charge(2, 0, 5, 201, "ch_a", true), charge(1, 1, 9, 201, "ch_a", false)},
			history.Linearizable, ""}, // the first's charge took effect before the replay read it
		{"ALostAnswerMayHaveCharged", []history.Op{charge(1, 0, 5, 0, "", false), charge(2, 10, 20, 201, "ch_a", true),
			ledger(30, 31, "ch_a")}, history.Linearizable, ""},
		{"ALostAnswerMayNotHave", []history.Op{charge(1, 0, 5, 0, "", false), ledger(10, 11)}, history.Linearizable, ""},
		{"A503ThenACharge", []history.Op{charge(1, 0, 5, 503, "", false), charge(2, 10, 20, 201, "ch_a", false),
			ledger(30, 31, "ch_a")}, history.Linearizable, ""},
		// A 422 seen before any 201: the other request's attempt lost its
		// answer, so it may have charged first.
		{"RefusedAfterALostAnswer", []history.Op{{Kind: history.Charge, Client: 1, CallUS: 0, ReturnUS: 3, Key: acme, Fingerprint: "fp2"},
			charge(2, 4, 8, 422, "", false)}, history.Linearizable, ""},
		{"RefusedWithNothingCharged", []history.Op{charge(2, 4, 8, 422, "", false), ledger(10, 11)},
			history.Violation, `attempt 2 was refused with 422, though nothing had charged the key`},
		{"AnotherRequestCharged", []history.Op{charge(1, 0, 10, 201, "ch_a", false), other},
			history.Violation, `charges for one key|different requests`},
		{"AnotherRequestRefused", []history.Op{charge(1, 0, 10, 201, "ch_a", false), refused, ledger(40, 41, "ch_a")}, history.Linearizable, ""},
		// The redis crash: every answer names the second charge, and only
		// the ledger shows the first.
		{"TheLedgerShowsWhatAnswersHide", []history.Op{charge(1, 0, 5, 0, "", false), charge(2, 10, 20, 201, "ch_b", false),
			charge(3, 11, 21, 201, "ch_b", true), ledger(30, 31, "ch_a", "ch_b")},
			history.Violation, `attempts 2 and 3 were told ch_b, but the ledger holds ch_a and ch_b`},
		{"WithoutTheLedgerReadItHides", []history.Op{charge(1, 0, 5, 0, "", false), charge(2, 10, 20, 201, "ch_b", false),
			charge(3, 11, 21, 201, "ch_b", true)}, history.Linearizable, ""},
		{"AKeyWithHistoryReplaysIt", []history.Op{before, charge(1, 2, 10, 201, "ch_old", true), ledger(20, 21, "ch_old")},
			history.Linearizable, ""},
		{"AKeyWithHistoryChargedAgain", []history.Op{before, charge(1, 2, 10, 201, "ch_new", false), ledger(20, 21, "ch_old", "ch_new")},
			history.Violation, `attempt 1 was told ch_new, a new charge, though the key was charged before the run \(ch_old\)`},
		{"TwoTenantsTwoCharges", []history.Op{charge(1, 0, 10, 201, "ch_a", false), globex}, history.Linearizable, ""},
		{"ConflictAppliesNothing", []history.Op{charge(1, 0, 10, 409, "", false), ledger(20, 21)}, history.Linearizable, ""},
		{"TheLedgerRefutesAnAnswer", []history.Op{charge(1, 0, 10, 201, "ch_a", false), ledger(20, 21, "ch_z")},
			history.Violation, `attempt 1 was told ch_a, but the ledger holds ch_z`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := check(t, tc.ops...)
			if r.Verdict != tc.want {
				t.Fatalf("%s (%s), want %s", r.Verdict, r.Why, tc.want)
			}
			if tc.why != "" && !regexp.MustCompile(tc.why).MatchString(r.Why) {
				t.Errorf("sentence %q, want one matching %q", r.Why, tc.why)
			}
		})
	}
}

// TestUnsafeStormIsAViolation: five attempts, five charges, as the design
// that checks no key answers them.
func TestUnsafeStormIsAViolation(t *testing.T) {
	t.Parallel()
	var ops []history.Op
	for c := 1; c <= 5; c++ {
		ops = append(ops, charge(c, int64(c), int64(100+c), 201, "ch_"+string(rune('a'+c)), false))
	}
	if r := check(t, ops...); r.Verdict != history.Violation || !strings.Contains(r.Why, "5 charges for one key") {
		t.Fatalf("%s: %s", r.Verdict, r.Why)
	}
}

func TestNDJSONRoundTrip(t *testing.T) {
	t.Parallel()
	h := history.History{Run: "run_x", Ops: []history.Op{charge(1, 0, 10, 201, "ch_a", false), ledger(20, 21, "ch_a")},
		Events: []history.Event{{Name: "crash", AtUS: 5, Client: 1, Detail: "the server died"}}}
	var b bytes.Buffer
	if err := h.WriteNDJSON(&b); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(b.String(), "\n"); n != 4 {
		t.Fatalf("%d lines:\n%s", n, b.String())
	}
	got, err := history.ReadNDJSON(&b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Run != h.Run || len(got.Ops) != 2 || got.Ops[1].Charges[0] != "ch_a" || len(got.Events) != 1 {
		t.Fatalf("read back %+v", got)
	}
	for _, bad := range []string{
		`{"op":{"kind":"charge","client":1,"call_us":5,"return_us":1,"key":{"key":"k"}}}`, // returns before its call
		`{"op":{"kind":"refund","client":1,"call_us":0,"return_us":1,"key":{"key":"k"}}}`,
		`{"op":{"kind":"charge","client":1,"call_us":0,"return_us":1,"key":{"key":""}}}`,
		`{"op":{"kind":"charge","client":1,"call_us":0,"return_us":1,"key":{"key":"k"},"bogus":1}}`,
		`{"run":"r"}`, // no operation
		`not json`,
	} {
		if _, err := history.ReadNDJSON(strings.NewReader(bad)); err == nil {
			t.Errorf("%s: read without an error", bad)
		}
	}
}

// TestThePictureIsSelfContained: the HTML holds its script and style, and
// names no other origin.
func TestThePictureIsSelfContained(t *testing.T) {
	t.Parallel()
	h := history.History{Run: "run_p", Ops: []history.Op{charge(1, 0, 10, 201, "ch_a", false), charge(2, 1, 12, 201, "ch_b", false)},
		Events: []history.Event{{Name: "crash", AtUS: 5, Client: 1}}}
	r := history.Check(h, history.DefaultTimeout)
	var b bytes.Buffer
	if err := r.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if !strings.Contains(page, "<script") || regexp.MustCompile(`(src|href)="(https?:)?//`).MatchString(page) {
		t.Fatalf("the picture loads something from elsewhere, or has no script (%d bytes)", len(page))
	}
	if !strings.Contains(page, "attempt 2: 201 ch_b") {
		t.Errorf("the picture does not name the operations")
	}
}
