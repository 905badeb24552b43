package matrix_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/redisdb"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants/unsafestore"
)

// TestAVariantIsOnePackageAndOneLine registers a throwaway variant beside
// a built-in one and finds it everywhere the lab lists designs, with no
// other edit: the index the page builds its controls from, POST /charges,
// the lab runs with their explanation, and the matrix (whose other columns
// TestMatrix runs).
func TestAVariantIsOnePackageAndOneLine(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config(func(c *app.Config) {
		c.Variants, c.DefaultStore = []variant.Variant{unsafestore.Variant(), labtest.OneLock()}, labtest.OneLockName
		c.RedisPair = true // every row of the matrix runs, failover included
	}))

	index := labtest.Decode[api.Index](t, labtest.Do(t, http.MethodGet, a.URL()+"/", nil, ""))
	last := index.Variants[len(index.Variants)-1]
	if last.Name != labtest.OneLockName || !last.Available || last.Label != "one lock around the charge" || !last.RequiresKey {
		t.Fatalf("index lists %+v last", last)
	}
	if _, ok := index.Stores[labtest.OneLockName]; !ok {
		t.Fatal("index.stores lacks the new variant")
	}

	if r := labtest.Charge(t, a.URL(), labtest.OneLockName, labtest.Acme, "k-toy", e2e.Body2500); r.Status != http.StatusCreated {
		t.Fatalf("POST /charges: %d %s", r.Status, r.Body)
	}
	if r := labtest.Charge(t, a.URL(), labtest.OneLockName, labtest.Acme, "k-toy", e2e.Body2500); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("sequential retry: %d, replayed %q", r.Status, r.Header.Get("Idempotent-Replayed"))
	}
	rep := labtest.Get[experiment.Report](t, a.URL()+"/charge-idempotent?store="+string(labtest.OneLockName)+"&attempts=16&key=k-toy-storm", "")
	if rep.Verdict != lab.Holds || rep.ExpectedVerdict != lab.Holds || rep.Explanation == "" {
		t.Fatalf("run: %s, expected %q, explanation %q", rep.Verdict, rep.ExpectedVerdict, rep.Explanation)
	}
	if n := e2e.KeyCharges(t, a, "acme", labtest.OneLockName, "k-toy-storm"); n != rep.KeyCharges || n != 1 {
		t.Fatalf("ledger holds %d charges, the report %d", n, rep.KeyCharges)
	}

	m, err := a.Service().Matrix(t.Context(), a.Public(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Stores[len(m.Stores)-1]; got != labtest.OneLockName {
		t.Fatalf("matrix columns %v", m.Stores)
	}
	_, noPair := redisdb.FindServer() // the failover row runs on a pair of redis-servers
	for _, row := range m.Rows {
		c := row.Cells[len(row.Cells)-1]
		if row.Case.Name == "redis_failover" && noPair != nil {
			if c.Available || !strings.Contains(c.HowToEnable, "apt-get install redis-server") {
				t.Errorf("failover without redis-server: cell %+v, want it unavailable, saying what to install", c)
			}
			continue
		}
		if row.Case.NeedsPGPair { // it keeps its keys in the process: no PostgreSQL to fail over
			if !c.NotApplicable {
				t.Errorf("%s: cell %+v, want it not applicable", row.Case.Name, c)
			}
			continue
		}
		if c.Store != labtest.OneLockName || !c.Available || c.RunID == "" {
			t.Errorf("%s: cell %+v, want a real run", row.Case.Name, c)
		}
	}
	var md strings.Builder
	if err := m.WriteMarkdown(&md); err != nil || !strings.Contains(md.String(), "`"+string(labtest.OneLockName)+"`") {
		t.Fatalf("markdown lacks the column (%v):\n%s", err, md.String())
	}
}
