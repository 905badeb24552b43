package experiment

import (
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
)

// TestOnChargedKey: each kind of history gets the sentence its figures
// support, and only that one.
func TestOnChargedKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		ev   evidence
		want []string
		not  []string
	}{
		{"KnownAndReplayed", evidence{prior: 1, keyBefore: lab.KeyCompleted, replays: 5},
			[]string{"(1 charge(s)", "still knew it (completed)", "added nothing", "5 replayed"}, []string{"more", "409", "422"}},
		{"ReusedWithAnotherAmount", evidence{prior: 1, keyBefore: lab.KeyCompleted, rejected: 5},
			[]string{"added nothing", "5 got 422"}, []string{"replayed", "wait"}},
		{"Forgotten", evidence{prior: 5, added: 5, keyBefore: lab.KeyAbsent, freshBy: map[string]int{"r1": 5}},
			[]string{"(5 charge(s)", "no longer held the key", "charged 5 more (r1 charged 5)"}, []string{"added nothing", "replayed"}},
		{"OneMapPerReplica", evidence{prior: 3, added: 2, keyBefore: lab.KeyCompleted, replays: 7, freshBy: map[string]int{"r2": 1, "r3": 1}},
			[]string{"several replicas charged it", "charged 2 more (r2 charged 1, r3 charged 1)", "7 replayed"}, []string{"no longer held"}},
		{"NoKeyKept", evidence{keyless: true, prior: 5, added: 5, keyBefore: lab.KeyAbsent, freshBy: map[string]int{"r1": 5}},
			[]string{"this design keeps no key", "charged 5 more"}, []string{"expired"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := tc.ev.onChargedKey()
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("%q lacks %q", text, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(text, n) {
					t.Errorf("%q claims %q, which the figures do not support", text, n)
				}
			}
		})
	}
}
