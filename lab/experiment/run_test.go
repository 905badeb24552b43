package experiment_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/variant"
)

// keyed is a registry with one design that checks keys; the runner only
// reads its declaration.
func keyed(t *testing.T) *variant.Registry {
	t.Helper()
	reg, err := variant.NewRegistry(variant.Variant{
		Name: "keyed", RequiresKey: true, Effects: "outbox", Crash: variant.CrashRollsBack,
		Open: func(context.Context, variant.Deps) (lab.Store, error) { return nil, nil },
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries: {Usual: lab.Holds, Holds: "it holds", Breaks: "it breaks"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestUnansweredRunIsInconclusive: when the attempts get no usable answer
// the run claims no verdict, even though the ledger's count (one earlier
// charge for the key) would read as "holds".
func TestUnansweredRunIsInconclusive(t *testing.T) {
	books := inmem.NewBooks(time.Now)
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: 2500, Currency: "USD"}
	a := lab.Attempt{Scope: lab.Scope{Namespace: "acme", Tenant: "acme", Endpoint: lab.Endpoint, Key: "k"}, Request: req, Store: "keyed"}
	if _, err := books.Apply(context.Background(), lab.Apply{Entry: lab.NewEntry(a, time.Now())}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte(`{"code":"invalid_parameter"}`))
	}))
	defer srv.Close()
	client := &http.Client{}
	defer client.CloseIdleConnections()
	r := &experiment.Runner{Client: client, Books: books, Provider: labtest.Provider(t), Variants: keyed(t), Now: time.Now}
	rep, err := r.Run(context.Background(), experiment.Spec{
		Store: "keyed", Key: "k", Account: "acct-1", AmountCents: 2500, Attempts: 3, Namespace: "acme", Tenant: "acme", Token: "tok",
	}, []string{srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Verdict != lab.Inconclusive || rep.DuplicatesPrevented != 0 || rep.KeyCharges != 1 {
		t.Fatalf("verdict %s, prevented %d, key charges %d: %s", rep.Verdict, rep.DuplicatesPrevented, rep.KeyCharges, rep.Reason)
	}
}

// TestUnovertakenStaleWorkerIsInconclusive: a stale worker that woke
// before any retry took its key over wrote as the only worker; the ledger's
// one charge then says nothing of the fence, and the run must not claim
// that the fence refused anything.
func TestUnovertakenStaleWorkerIsInconclusive(t *testing.T) {
	books := inmem.NewBooks(time.Now)
	reg, err := variant.NewRegistry(variant.Variant{
		Name: "leased", RequiresKey: true, Effects: "outbox", Crash: variant.CrashRollsBack, Lifetime: "lease",
		Open: func(context.Context, variant.Deps) (lab.Store, error) { return nil, nil },
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.FaultCase(lab.FaultStaleWorker): {Usual: lab.Holds, Holds: "the ledger refused the stale token", Breaks: "it breaks"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	state := lab.KeyAbsent
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/idempotency/state" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"key_state":%q}`, state)
			return
		}
		// The first attempt woke and wrote before any retry came; the
		// retries replay its response.
		phases := lab.NewPhases(time.Now())
		ctx := lab.WithPhases(r.Context(), phases)
		if state == lab.KeyAbsent {
			lab.Mark(ctx, lab.PhaseClaim)
			lab.Mark(ctx, lab.PhaseWork)
			a := lab.Attempt{Scope: lab.Scope{Namespace: "acme", Tenant: "acme", Endpoint: lab.Endpoint, Key: "k"}, Run: r.Header.Get("Lab-Run"),
				Request: lab.ChargeRequest{Account: "acct-1", AmountCents: 2500, Currency: "USD"}, Store: "leased"}
			if _, err := books.Apply(r.Context(), lab.Apply{Entry: lab.NewEntry(a, time.Now())}); err != nil {
				t.Error(err)
			}
			lab.Mark(ctx, lab.PhaseCommit)
			state = lab.KeyCompleted
		} else {
			lab.Mark(ctx, lab.PhaseReplay)
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.Header().Set("Server-Timing", phases.ServerTiming())
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}))
	defer srv.Close()
	client := &http.Client{}
	defer client.CloseIdleConnections()
	r := &experiment.Runner{Client: client, Books: books, Provider: labtest.Provider(t), Variants: reg, Now: time.Now}
	rep, err := r.Run(context.Background(), experiment.Spec{
		Store: "leased", Key: "k", Account: "acct-1", AmountCents: 2500, Attempts: 3, Namespace: "acme", Tenant: "acme", Token: "tok",
		Faults: lab.Faults{Point: lab.FaultStaleWorker, Work: 300 * time.Millisecond, ClaimTTL: 100 * time.Millisecond},
	}, []string{srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if rep.KeyCharges != 1 || rep.IdempotencyHits != 2 || rep.FencedWrites != 0 {
		t.Fatalf("key charges %d, replays %d, fenced %d; want the worker's one charge, replayed twice", rep.KeyCharges, rep.IdempotencyHits, rep.FencedWrites)
	}
	if rep.Verdict != lab.Inconclusive || strings.Contains(rep.Explanation, "refused") || !strings.Contains(rep.Explanation, "no retry took the key over") {
		t.Fatalf("verdict %s: %s", rep.Verdict, rep.Explanation)
	}
}

// TestMatrixTableAligns: every column of the plain-text matrix starts at
// the same place on every line, whatever the length of the case titles.
func TestMatrixTableAligns(t *testing.T) {
	m := experiment.Matrix{Stores: []lab.StoreName{"unsafe", "redis+postgres"}}
	for _, c := range experiment.Cases() {
		m.Rows = append(m.Rows, experiment.Row{Case: c, Cells: []experiment.Cell{
			{Store: "unsafe", Available: true, Verdict: lab.Breaks, Charges: 12, ExpectedCharges: 1},
			{Store: "redis+postgres", Available: false},
		}})
	}
	var b strings.Builder
	if err := m.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")[:len(m.Rows)+1]
	col := func(l, word string) int { return strings.Index(l, word) }
	header := lines[0]
	for _, l := range lines[1:] {
		if col(l, "breaks") != col(header, "unsafe") || col(l, "n/a") != col(header, "redis+postgres") {
			t.Errorf("misaligned:\n%s\n%s", header, l)
		}
	}
}
