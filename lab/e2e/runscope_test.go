package e2e_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
)

// TestRunsCountOnlyTheirNamespace: another namespace's charges tagged with
// a run's id are refused (400 naming Lab-Run) and never counted, so a run's
// figures cannot be inflated from outside; a made-up run is refused too,
// and a run opened with POST /lab/runs counts the charges sent with it.
func TestRunsCountOnlyTheirNamespace(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, postgres.Name))
	rep := e2e.Run(t, a.URL(), memory.Name, "key=fresh&attempts=3")
	if rep.ChargesApplied != 1 {
		t.Fatalf("the run charged %d", rep.ChargesApplied)
	}
	send := func(token, key, run string) labtest.Reply {
		h := http.Header{"Authorization": {"Bearer " + token}, "Idempotency-Key": {key}, "Lab-Run": {run}}
		return labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=memory", h, e2e.Body2500)
	}
	for i, key := range []string{"intruder-1", "intruder-2", "intruder-3"} {
		r := send(labtest.Globex, key, rep.RunID) // globex is a namespace of its own
		labtest.WantProblem(t, fmt.Sprintf("charge %d tagged with acme's run", i), r, http.StatusBadRequest, "invalid_parameter", "Lab-Run")
		if n := e2e.KeyCharges(t, a, "globex", memory.Name, key); n != 0 {
			t.Fatalf("the refused charge %s was applied %d times", key, n)
		}
	}
	if s := e2e.RunStats(t, a, rep.RunID); s.Charges != 1 {
		t.Fatalf("acme's run counts %d charges after globex tagged three with it", s.Charges)
	}
	if r := send(labtest.Acme, "made-up-1", "run_made_up"); r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), "Lab-Run") {
		t.Fatalf("a run the lab never opened: %d %s", r.Status, r.Body)
	}
	opened := labtest.Decode[struct {
		RunID string `json:"run_id"`
	}](t, labtest.Do(t, http.MethodPost, a.URL()+"/lab/runs", labtest.Bearer(labtest.Acme), ""))
	for _, key := range []string{"mine-1", "mine-2"} {
		if r := send(labtest.Acme, key, opened.RunID); r.Status != http.StatusCreated {
			t.Fatalf("a charge in a run of one's own: %d %s", r.Status, r.Body)
		}
	}
	if r := send(labtest.Globex, "intruder-4", opened.RunID); r.Status != http.StatusBadRequest {
		t.Fatalf("globex joining acme's opened run: %d", r.Status)
	}
	if s := e2e.RunStats(t, a, opened.RunID); s.Charges != 2 || s.OutboxEvents != 2 {
		t.Fatalf("the opened run counts %+v, want the 2 charges sent with it", s)
	}
}
