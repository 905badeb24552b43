package app

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labsvc"
	"github.com/idempotency-lab/lab/lab/variant"
)

// forgetful is a store that records what it was told to forget.
type forgetful struct {
	lab.Store
	mu     sync.Mutex
	forgot []lab.Namespace
}

func (f *forgetful) Reset(_ context.Context, ns lab.Namespace) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgot = append(f.forgot, ns)
	return nil
}

type nothing struct{}

func (nothing) Reset(context.Context, lab.Namespace) error { return nil }

type noProvider struct{}

func (noProvider) Reset(context.Context, string) error { return nil }

// replicaWith is an in-process replica whose only store is st.
func replicaWith(t *testing.T, name string, st *forgetful, set *replicaSet) *replica {
	t.Helper()
	reg, err := variant.NewRegistry(variant.Variant{Name: "toy", Label: "toy", Decides: "d", Keys: "k", Effects: "outbox",
		Crash: variant.CrashNothingToLose, Open: func(context.Context, variant.Deps) (lab.Store, error) { return st, nil }})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := labsvc.New(labsvc.Config{Runner: &experiment.Runner{}, Books: nothing{}, Provider: noProvider{}, Variants: reg,
		Stores: map[lab.StoreName]lab.Store{"toy": st}, Replicas: set})
	if err != nil {
		t.Fatal(err)
	}
	return &replica{name: name, service: svc, url: "http://" + name}
}

// TestResetReachesTheOtherReplicas: the replica asked resets the others —
// in-process ones by the namespace the API resolved, peer processes through
// their own /reset-lab with the caller's credentials, every namespace as
// all=true.
func TestResetReachesTheOtherReplicas(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var asked []string
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	t.Cleanup(peer.Close)
	set := &replicaSet{peers: []string{peer.URL}, client: peer.Client(), failover: &redisFailover{how: "no pair here"}}
	first, second := &forgetful{}, &forgetful{}
	set.primary = replicaWith(t, "r1", first, set)
	set.extra = []*replica{replicaWith(t, "r2", second, set)}

	if err := set.ResetOthers(t.Context(), "r1", "acme~3", "Bearer tok"); err != nil {
		t.Fatal(err)
	}
	if err := set.ResetOthers(t.Context(), "r1", "", "Bearer admin"); err != nil {
		t.Fatal(err)
	}
	if len(first.forgot) != 0 {
		t.Errorf("the replica that was asked reset itself through the set: %v", first.forgot)
	}
	if got := second.forgot; len(got) != 2 || got[0] != "acme~3" || got[1] != "" {
		t.Errorf("the in-process replica forgot %q, want acme~3 then every namespace", got)
	}
	want := []string{"POST /reset-lab?local=true&all=false Bearer tok", "POST /reset-lab?local=true&all=true Bearer admin"}
	if len(asked) != 2 || asked[0] != want[0] || asked[1] != want[1] {
		t.Errorf("the peer was asked %q, want %q", asked, want)
	}
	// Asked of r2, the set reaches the primary, and not r2 again.
	if err := set.ResetOthers(t.Context(), "r2", "globex", "Bearer g"); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(first.forgot) != "[globex]" || len(second.forgot) != 2 {
		t.Errorf("a reset asked of r2: r1 forgot %v, r2 %v", first.forgot, second.forgot)
	}
	if set.MaxReplicas() != 2 || set.PairUnavailable() != "no pair here" {
		t.Errorf("a cluster of one peer: %d replicas, pair %q", set.MaxReplicas(), set.PairUnavailable())
	}
	if _, err := set.Targets(t.Context(), 3); err == nil {
		t.Error("three targets from a primary and one peer")
	}
	if urls, err := set.Targets(t.Context(), 2); err != nil || len(urls) != 2 || urls[1] != peer.URL {
		t.Errorf("two targets: %v %v", urls, err)
	}
}
