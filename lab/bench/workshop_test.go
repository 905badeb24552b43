package bench

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
)

// TestWorkshopChecksCatchWrongAnswers feeds the workshop's checks answers
// that are wrong in each way they look for: each must fail, saying how.
func TestWorkshopChecksCatchWrongAnswers(t *testing.T) {
	w := &workshop{res: &WorkshopResult{Alone: map[string]lab.Verdict{"memory 5 attempts": lab.Holds}}}
	a := &attendee{Tenant: "t1", SecondTenant: "t1-b", Namespace: "t1", n: 1}
	path := map[string]pathStep{}
	for _, s := range workshopPath(func(lab.StoreName) bool { return true }) {
		path[s.name] = s
	}
	replayed := http.Header{"Idempotent-Replayed": {"true"}}
	run := `{"verdict":"holds","namespace":"t1","ledger_rows":[{"charge_id":"c1","tenant":"t1"},{"charge_id":"c2","tenant":"t1-b"}]}`
	for _, tc := range []struct {
		name, step string
		status     int
		header     http.Header
		body, want string // want "" holds
	}{
		{"a run as alone", "memory 5 attempts", 200, nil, run, ""},
		{"another status", "memory 5 attempts", 500, nil, `{}`, "answered 500, not 200"},
		{"another verdict", "memory 5 attempts", 200, nil, strings.Replace(run, "holds", "breaks", 1), "verdict breaks, alone holds"},
		{"another namespace", "memory 5 attempts", 200, nil, strings.Replace(run, `"namespace":"t1"`, `"namespace":"t2"`, 1), "namespace t2"},
		{"another tenant's row", "memory 5 attempts", 200, nil, strings.Replace(run, `"tenant":"t1-b"`, `"tenant":"t2"`, 1), "charge c2 of tenant t2"},
		{"a replay", "charge replayed", 201, replayed, `{}`, ""},
		{"a replay not said", "charge replayed", 201, nil, `{}`, "not answered as a replay"},
		{"a stepped race as stepped", "stepped race", 201, nil, `{"ledger":{"charges":2}}`, ""},
		{"a stepped race short", "stepped race", 201, nil, `{"ledger":{"charges":1}}`, "holds 1 charges, not 2"},
		{"a check that passed", "lab check postgres", 200, nil, `{"failed":[]}`, ""},
		{"a check that failed", "lab check postgres", 200, nil, `{"failed":["retries"]}`, "the check failed retries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, ok := path[tc.step]
			if !ok {
				t.Fatalf("no step %q on the path", tc.step)
			}
			_, err := w.check(a, s, tc.status, tc.header, []byte(tc.body))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("failed: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
