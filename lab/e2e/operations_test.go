package e2e_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/lease"
)

// TestOperationsRoute: a twin of long work on the lease store gets 202
// Accepted with Location; the operation there shows the claim's token and
// lease, then the final answer, which a retry replays.
func TestOperationsRoute(t *testing.T) {
	t.Parallel()
	cfg := e2e.StoreConfig(t, "postgres")
	cfg.BasePath = "/16"
	cfg.InFlightWait = 100 * time.Millisecond
	a := labtest.Start(t, cfg)
	h := http.Header{"Authorization": {"Bearer " + labtest.Acme}, "Idempotency-Key": {"k-op"}, "Content-Type": {"application/json"}}
	slow := http.Header{lab.FaultHeader: {"slow; work_ms=1500"}}
	for k, v := range h {
		slow[k] = v
	}
	owner := make(chan labtest.Reply, 1)
	go func() { owner <- labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=lease", slow, e2e.Body2500) }()
	var accepted labtest.Reply
	labtest.Eventually(t, "the owner's operation committed", func() bool {
		accepted = labtest.Do(t, http.MethodGet, a.URL()+"/operations/k-op?store=lease", h, "")
		return accepted.Status == http.StatusOK
	})
	twin := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=lease", h, e2e.Body2500)
	if twin.Status != http.StatusAccepted || twin.Header.Get("Location") != "/16/operations/k-op?store=lease" || twin.Header.Get("Retry-After") == "" {
		t.Fatalf("twin during the work: %d %v %s; want 202 with Location and Retry-After", twin.Status, twin.Header, twin.Body)
	}
	op := labtest.Decode[lab.Operation](t, twin)
	if op.State != lab.KeyInFlight || op.Token < 1 || op.LeaseExpires.IsZero() {
		t.Fatalf("the 202's operation %+v", op)
	}
	first := <-owner
	if first.Status != http.StatusCreated {
		t.Fatalf("owner: %d %s", first.Status, first.Body)
	}
	done := labtest.Decode[lab.Operation](t, labtest.Do(t, http.MethodGet, a.URL()+"/operations/k-op?store=lease", h, ""))
	if done.State != lab.KeyCompleted || done.Status != http.StatusCreated || !jsonEqual(done.Body, first.Body) {
		t.Fatalf("operation after the work: %+v; want completed with the owner's 201", done)
	}
	if again := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=lease", h, e2e.Body2500); again.Status != http.StatusCreated ||
		again.Header.Get("Idempotent-Replayed") != "true" || string(again.Body) != string(first.Body) {
		t.Fatalf("retry after the work: %d %s", again.Status, again.Body)
	}
	// Another tenant sees no such operation; a store without operations says so.
	other := labtest.Bearer(labtest.Globex)
	if r := labtest.Do(t, http.MethodGet, a.URL()+"/operations/k-op?store=lease", other, ""); r.Status != http.StatusNotFound {
		t.Fatalf("another tenant's view: %d %s", r.Status, r.Body)
	}
	if r := labtest.Do(t, http.MethodGet, a.URL()+"/operations/k-op?store=postgres", h, ""); r.Status != http.StatusBadRequest {
		t.Fatalf("postgres operations: %d %s", r.Status, r.Body)
	}
	if e2e.KeyCharges(t, a, "acme", lease.Name, "k-op") != 1 {
		t.Fatal("want exactly one charge")
	}
}

// jsonEqual compares two JSON documents by value.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}

// TestStaleWorkerRunWithItsDefaults: the route's stale_worker defaults
// (the page shows them) make the worker outlive its lease; lease holds and
// reports the write it fenced out, redis breaks.
func TestStaleWorkerRunWithItsDefaults(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.FullConfig(t))
	for store, want := range map[lab.StoreName]lab.Verdict{lease.Name: lab.Holds, "redis": lab.Breaks} {
		rep := e2e.RunOvertaken(t, a.URL(), store, "attempts=3")
		if rep.Verdict != want || (store == lease.Name && rep.FencedWrites != 1) {
			t.Errorf("%s: %s, %d fenced write(s); want %s: %s", store, rep.Verdict, rep.FencedWrites, want, rep.Explanation)
		}
	}
}
