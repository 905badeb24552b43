package e2e_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/history"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// TestEveryRunIsProved runs the three runs on real stores and
// checks what each answers as its proof, and what its history holds:
// memory on three replicas is a violation named in a sentence, postgres is
// linearizable, and redis charged twice after a crash is a violation seen
// only through the ledger's read: without it, its answers are linearizable.
func TestEveryRunIsProved(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.FullConfig(t))
	run := func(q string) experiment.Report {
		t.Helper()
		return labtest.Get[experiment.Report](t, a.URL()+"/charge-idempotent?"+q, "")
	}
	ledgerHistory := func(rep experiment.Report) history.History {
		t.Helper()
		r := labtest.Do(t, http.MethodGet, a.URL()+"/lab/runs/"+rep.RunID+"/history", nil, "")
		if r.Status != http.StatusOK || r.Header.Get("Content-Type") != "application/x-ndjson" {
			t.Fatalf("history of %s: %d %s", rep.RunID, r.Status, r.Body)
		}
		h, err := history.ReadNDJSON(bytes.NewReader(r.Body))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}

	mem := run("store=memory&replicas=3&key=fresh")
	if mem.Checked != history.Violation || !strings.Contains(mem.CheckedWhy, "charges for one key") || mem.KeyCharges < 2 || !mem.Money.Holds {
		t.Errorf("memory on 3 replicas, %d charges: checked %s (%s), money %+v", mem.KeyCharges, mem.Checked, mem.CheckedWhy, mem.Money)
	}
	pg := run("store=postgres&key=fresh")
	if pg.Checked != history.Linearizable || pg.KeyCharges != 1 || !pg.Money.Holds || pg.CheckedOps != pg.Attempts+2 {
		t.Errorf("postgres, %d charges: checked %s over %d ops (%s), money %+v", pg.KeyCharges, pg.Checked, pg.CheckedOps, pg.CheckedWhy, pg.Money)
	}

	rd := run("store=redis&fault=crash_after_charge&key=fresh")
	if rd.KeyCharges != 2 || rd.Checked != history.Violation || !strings.Contains(rd.CheckedWhy, "but the ledger holds") {
		t.Fatalf("redis after a crash, %d charges: checked %s (%s)", rd.KeyCharges, rd.Checked, rd.CheckedWhy)
	}
	h := ledgerHistory(rd)
	if got := history.Check(h, history.DefaultTimeout); got.Verdict != history.Violation {
		t.Errorf("the served history checks %s, the run said violation", got.Verdict)
	}
	// Every answer names the second charge: the answers alone agree.
	var told []string
	answers := h
	answers.Ops = nil
	for _, o := range h.Ops {
		if o.Kind == history.LedgerRead {
			continue
		}
		answers.Ops = append(answers.Ops, o)
		if o.ChargeID != "" && !strings.Contains(strings.Join(told, " "), o.ChargeID) {
			told = append(told, o.ChargeID)
		}
	}
	if got := history.Check(answers, history.DefaultTimeout); got.Verdict != history.Linearizable || len(told) != 1 {
		t.Errorf("without the ledger reads: %s (%s), charges told %v; want linearizable, one charge told", got.Verdict, got.Why, told)
	}
	// And the picture of it, served as one page.
	if r := labtest.Do(t, http.MethodGet, a.URL()+"/lab/runs/"+rd.RunID+"/history.html", nil, ""); r.Status != http.StatusOK ||
		!strings.HasPrefix(r.Header.Get("Content-Type"), "text/html") || !bytes.Contains(r.Body, []byte("ledger read")) {
		t.Errorf("history.html: %d %s", r.Status, r.Header.Get("Content-Type"))
	}
	// Another namespace cannot read it.
	if r := labtest.Do(t, http.MethodGet, a.URL()+"/lab/runs/"+rd.RunID+"/history", http.Header{"Authorization": {"Bearer " + labtest.Globex}}, ""); r.Status != http.StatusNotFound {
		t.Errorf("globex reading acme's history: %d", r.Status)
	}
}
