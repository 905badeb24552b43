package bench

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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

// TestWorkshopShedIsNotAnError: a 429 or 503 with Retry-After is shed,
// whatever its problem code, and shows as shed in the table's statuses and
// in the summary alike; a 503 without Retry-After is an error in both.
func TestWorkshopShedIsNotAnError(t *testing.T) {
	var mu sync.Mutex
	tries := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		tries[r.URL.Path]++
		first := tries[r.URL.Path] == 1
		mu.Unlock()
		switch {
		case r.URL.Path == "/error":
			rw.WriteHeader(http.StatusServiceUnavailable)
		case first && r.URL.Path == "/busy":
			rw.Header().Set("Retry-After", "1")
			rw.WriteHeader(http.StatusServiceUnavailable)
			_, _ = rw.Write([]byte(`{"code":"lab_busy"}`))
		case first && r.URL.Path == "/pool":
			rw.Header().Set("Retry-After", "1")
			rw.WriteHeader(http.StatusServiceUnavailable)
			_, _ = rw.Write([]byte(`{"code":"store_unavailable"}`))
		}
	}))
	defer srv.Close()
	w := &workshop{cfg: WorkshopConfig{URL: srv.URL}, client: srv.Client(), steps: map[string]*StepStats{}, routes: map[string]*StepStats{},
		res: &WorkshopResult{Alone: map[string]lab.Verdict{}}}
	for _, name := range []string{"busy", "pool", "error"} {
		s := pathStep{name: name, method: http.MethodGet, route: "/" + name, target: fixed("/" + name), want: http.StatusOK}
		w.path = append(w.path, s)
		_, _ = w.do(t.Context(), &attendee{n: 1}, 0, s, true)
	}
	w.conclude()
	for _, st := range w.res.Steps {
		want := map[string]string{"busy": "200×1 shed 503×1", "pool": "200×1 shed 503×1", "error": "503×1"}[st.Name]
		if got := statusText(st.Statuses); got != want {
			t.Errorf("%s: statuses %q, want %q", st.Name, got, want)
		}
	}
	var table strings.Builder
	if err := w.res.WriteTable(&table, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 answers (shed 503×2)", "1 answers 5xx without Retry-After"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the summary does not say %q:\n%s", want, table.String())
		}
	}
}
