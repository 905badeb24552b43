package failover_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/phases"
)

// TestPhasesRunShowsTheResume: a run on phases whose first attempt
// crashes after phase 2. Its retries are answered with the one charge, and
// the one that resumed the key and finished it shows it on its lane: it
// resumed at charge_created, called the provider and committed, without a
// claim or a charge of its own. The ledger and the provider hold one charge and one capture.
func TestPhasesRunShowsTheResume(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, phases.Name))
	rep := e2e.Run(t, a.URL(), phases.Name, "key=k-resume&attempts=3&fault=crash_after_phase&phase=2&ttl_ms=300")
	if rep.Verdict != lab.Holds || e2e.KeyCharges(t, a, "acme", phases.Name, "k-resume") != 1 || rep.ProviderCaptures != 1 {
		t.Fatalf("verdict %s, %d charge(s), %d capture(s); want holds, one of each", rep.Verdict, e2e.KeyCharges(t, a, "acme", phases.Name, "k-resume"), rep.ProviderCaptures)
	}
	// One try resumes the key and finishes it. On a slow machine a resume
	// can outlast its 300 ms lease: a later attempt takes the key over and
	// the first is fenced before it calls anyone, the design at work.
	finished := 0
	for _, at := range rep.Timeline {
		for _, try := range at.Tries {
			names := make([]string, 0, len(try.Phases))
			for _, p := range try.Phases {
				names = append(names, p.Name)
				if p.Name == lab.PhaseResume && p.Detail != "resumed at charge_created" {
					t.Errorf("attempt %d resumed with %q, want at charge_created", at.Attempt, p.Detail)
				}
			}
			switch {
			case !slices.Contains(names, lab.PhaseResume):
			case slices.Contains(names, lab.PhaseClaim) || slices.Contains(names, lab.PhaseCharge):
				t.Errorf("attempt %d's resumed try passed %v: a claim or a charge of its own", at.Attempt, names)
			case slices.Contains(names, lab.PhaseFenced):
				t.Logf("attempt %d's resume was fenced (%v): another attempt took the key over", at.Attempt, names)
			case !slices.Contains(names, lab.PhaseProvider) || !slices.Contains(names, lab.PhaseCommit):
				t.Errorf("attempt %d's resumed try passed %v: want the provider call and the commit", at.Attempt, names)
			default:
				finished++
			}
		}
	}
	if finished != 1 {
		t.Fatalf("%d tries resumed the key and finished it, want 1", finished)
	}
}

// TestPhasesCompleterFinishesAnAbandonedKey: a charge crashes after phase
// 2 and its client never retries; the lab's completer finishes the key on
// its own (completed_by: completer), and the client's late retry replays
// the one charge, captured once. Its lag is on /metrics.
func TestPhasesCompleterFinishesAnAbandonedKey(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, phases.Name))
	if _, err := e2e.PostWithFault(a.URL(), phases.Name, "k-abandoned", "crash_after_phase=2; ttl_ms=100"); err == nil {
		t.Fatal("the crashed charge was answered; want its connection dropped")
	}
	var k lab.KeyState
	labtest.Eventually(t, "the completer finishing k-abandoned", func() bool {
		k = labtest.Get[keyStateReply](t, a.URL()+"/idempotency/state?store=phases&key=k-abandoned", labtest.Acme).KeyState
		return k.State == lab.KeyCompleted
	})
	if k.CompletedBy != "completer" || k.RecoveryPoint != "finished" {
		t.Fatalf("key %+v: want finished by the completer", k)
	}
	r := labtest.Charge(t, a.URL(), phases.Name, labtest.Acme, "k-abandoned", e2e.Body2500)
	if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("late retry: %d replayed=%q %s; want a replay", r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
	}
	if n := e2e.KeyCharges(t, a, "acme", phases.Name, "k-abandoned"); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	metrics := labtest.Do(t, http.MethodGet, a.URL()+"/metrics", nil, "")
	if !strings.Contains(string(metrics.Body), `lab_completer_lag_seconds{store="phases"} 0`) {
		t.Errorf("/metrics lacks the completer's lag at 0 once it finished")
	}
}

type keyStateReply struct{ lab.KeyState }
