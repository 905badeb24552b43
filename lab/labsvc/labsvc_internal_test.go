package labsvc

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/tenants"
	"github.com/idempotency-lab/lab/lab/variant"
)

// calls records what a reset asked of the books, the provider and the
// other replicas.
type calls struct{ log []string }

func (c *calls) Reset(_ context.Context, ns lab.Namespace) error {
	c.log = append(c.log, "books "+string(ns))
	return nil
}

type provider struct{ c *calls }

func (p provider) Reset(_ context.Context, ns string) error {
	p.c.log = append(p.c.log, "provider "+ns)
	return nil
}

type replicas struct {
	c   *calls
	max int
}

func (r replicas) Targets(context.Context, int) ([]string, error)      { return []string{"http://r1"}, nil }
func (r replicas) MaxReplicas() int                                    { return r.max }
func (r replicas) PairUnavailable() string                             { return "" }
func (r replicas) StoresAt(string) (map[lab.StoreName]lab.Store, bool) { return nil, false }
func (r replicas) ResetOthers(_ context.Context, self string, ns lab.Namespace, creds string) error {
	r.c.log = append(r.c.log, fmt.Sprintf("others but %s: %s %s", self, ns, creds))
	return nil
}

// forgetful is a store with keys to forget.
type forgetful struct {
	lab.Store
	reset []lab.Namespace
}

func (f *forgetful) Reset(_ context.Context, ns lab.Namespace) error {
	f.reset = append(f.reset, ns)
	return nil
}

func service(t *testing.T, max int) (*Service, *calls, *forgetful) {
	t.Helper()
	c, st := &calls{}, &forgetful{}
	reg, err := variant.NewRegistry(variant.Variant{Name: "toy", Label: "toy", Decides: "d", Keys: "k", Effects: "outbox",
		Crash: variant.CrashNothingToLose, Open: func(context.Context, variant.Deps) (lab.Store, error) { return st, nil }})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Runner: &experiment.Runner{}, Books: c, Provider: provider{c}, Variants: reg,
		Stores: map[lab.StoreName]lab.Store{"toy": st}, Replicas: replicas{c, max}, Replica: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	return s, c, st
}

func report(ns lab.Namespace, id, matrix string, at time.Time) experiment.Report {
	return experiment.Report{RunID: id, Namespace: ns, Matrix: matrix, StartedAt: at,
		Timeline: []experiment.Result{{Attempt: 1}}, Events: []experiment.Event{{Name: "crash"}}}
}

func TestHistoryIsBoundedPerNamespaceAndApartForMatrixCells(t *testing.T) {
	t.Parallel()
	s, _, _ := service(t, 3)
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range MaxRunHistory + 5 {
		s.remember(report("acme", fmt.Sprint("own-", i), "", start.Add(time.Duration(i)*time.Second)))
		s.remember(report("acme", fmt.Sprint("cell-", i), "b1", start.Add(time.Duration(i)*time.Second+time.Millisecond)))
	}
	s.remember(report("globex", "theirs", "", start))
	runs := s.Runs("acme", false)
	if len(runs) != 2*MaxRunHistory {
		t.Fatalf("acme keeps %d runs, want %d of its own and %d cells", len(runs), MaxRunHistory, MaxRunHistory)
	}
	if runs[0].RunID != fmt.Sprint("cell-", MaxRunHistory+4) || runs[1].RunID != fmt.Sprint("own-", MaxRunHistory+4) {
		t.Errorf("newest first: %s, %s", runs[0].RunID, runs[1].RunID)
	}
	if runs[0].Timeline != nil || runs[0].Events != nil {
		t.Error("a listing carries the timelines")
	}
	if _, ok := s.FindRun("acme", "own-0"); ok {
		t.Error("the oldest own run outlived the bound")
	}
	if r, ok := s.FindRun("acme", "own-5"); !ok || len(r.Timeline) != 1 || len(r.Events) != 1 {
		t.Errorf("own-5 whole: %v %+v", ok, r)
	}
	if _, ok := s.FindRun("acme", "theirs"); ok {
		t.Error("acme found globex's run")
	}
	if _, ok := s.FindRun("", "theirs"); !ok {
		t.Error("the admin's view (every namespace) did not find globex's run")
	}
}

func TestSlowAttemptsAreBoundedPerNamespace(t *testing.T) {
	t.Parallel()
	s, _, _ := service(t, 3)
	var releases []func()
	for range MaxSlowAttempts {
		release, err := s.AdmitSlow("acme")
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	var limit *SlowLimitError
	if _, err := s.AdmitSlow("acme"); !errors.As(err, &limit) || limit.Limit != MaxSlowAttempts {
		t.Fatalf("one over the share: %v", err)
	}
	if release, err := s.AdmitSlow("globex"); err != nil {
		t.Fatalf("another namespace is refused: %v", err)
	} else {
		release()
	}
	releases[0]()
	if _, err := s.AdmitSlow("acme"); err != nil {
		t.Fatalf("after one ended: %v", err)
	}
}

func TestResetReachesEverything(t *testing.T) {
	t.Parallel()
	s, c, st := service(t, 3)
	s.remember(report("acme", "r1", "", time.Now()))
	s.remember(report("globex", "r2", "", time.Now()))
	if err := s.Reset(t.Context(), "acme", "Bearer tok"); err != nil {
		t.Fatal(err)
	}
	want := []string{"books acme", "provider acme", "others but r1: acme Bearer tok"}
	if fmt.Sprint(c.log) != fmt.Sprint(want) || fmt.Sprint(st.reset) != "[acme]" {
		t.Errorf("reset asked %v and the store %v, want %v and [acme]", c.log, st.reset, want)
	}
	if _, ok := s.FindRun("", "r1"); ok {
		t.Error("acme's run outlived its reset")
	}
	if _, ok := s.FindRun("", "r2"); !ok {
		t.Error("acme's reset forgot globex's run")
	}
}

func TestTheMatrixNeedsThreeReplicas(t *testing.T) {
	t.Parallel()
	s, _, _ := service(t, 2)
	var inv *lab.InvalidError
	if _, err := s.Matrix(t.Context(), tenants.Identity{Tenant: "acme", Namespace: "acme", Token: "tok"}, nil); !errors.As(err, &inv) {
		t.Fatalf("two replicas: %v", err)
	}
	if _, err := s.Store("nothing"); !errors.As(err, &inv) {
		t.Errorf("an unknown store: %v", err)
	}
}
