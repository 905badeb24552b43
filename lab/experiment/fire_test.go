package experiment_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
)

// TestAttemptsOverlap proves the barrier releases attempts together: the
// server answers none until all N are inside it, so a serial client would
// time out.
func TestAttemptsOverlap(t *testing.T) {
	const n = 32
	var mu sync.Mutex
	arrived := 0
	all := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived++
		if arrived == n {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
			w.WriteHeader(http.StatusCreated)
		case <-time.After(5 * time.Second):
			w.WriteHeader(http.StatusGatewayTimeout)
		}
	}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer client.CloseIdleConnections()
	reqs := make([]experiment.Request, n)
	for i := range reqs {
		reqs[i] = experiment.Request{URL: srv.URL, Header: http.Header{}}
	}
	results, spread := experiment.Fire(t.Context(), client, reqs, experiment.Retry{})
	for _, r := range results {
		if r.Final().Status != http.StatusCreated {
			t.Fatalf("attempt %d: %d: not all attempts were in flight together", r.Attempt, r.Final().Status)
		}
	}
	if spread <= 0 || spread > 5*time.Second {
		t.Fatalf("spread %v", spread)
	}
}

// TestPhasesAreDrawnWhenTheyHappened: every phase is placed at its instant
// on the server, however late the server took its request up. The
// replaying attempt is sent first, and its server takes it up only once
// the other attempt committed: placed from its try's start, as the
// server's durations alone would place it, its replay would be drawn
// before the commit it read.
func TestPhasesAreDrawnWhenTheyHappened(t *testing.T) {
	entered, committed := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		replay := r.URL.Path == "/replay"
		if replay {
			close(entered)
			select { // taken up late: after the commit it reads
			case <-committed:
			case <-r.Context().Done():
				return
			}
		}
		p := lab.NewPhases(time.Now())
		ctx := lab.WithPhases(r.Context(), p)
		if replay {
			lab.Mark(ctx, lab.PhaseReplay)
		} else {
			lab.Mark(ctx, lab.PhaseCommit)
			close(committed)
		}
		w.Header().Set("Server-Timing", p.ServerTiming())
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	fire := func(path string) []experiment.Result {
		res, _ := experiment.Fire(t.Context(), srv.Client(), []experiment.Request{{URL: srv.URL + path, Header: http.Header{}}}, experiment.Retry{})
		return res
	}
	origin := time.Now()
	replayed := make(chan []experiment.Result, 1)
	go func() { replayed <- fire("/replay") }()
	<-entered
	results := append(fire("/commit"), <-replayed...)
	experiment.Rebase(results, origin) // one axis, as a run's phases are

	at := map[string]float64{}
	for _, res := range results {
		try := res.Final()
		if try.Status != http.StatusCreated || len(try.Phases) != 1 {
			t.Fatalf("attempt to %s: %+v", res.Target, try)
		}
		p := try.Phases[0]
		at[p.Name] = p.AtMS
		if p.AtMS < try.StartMS || p.AtMS > try.StartMS+try.LatencyMS {
			t.Errorf("%s at %.3f ms, outside its try (%.3f..%.3f)", p.Name, p.AtMS, try.StartMS, try.StartMS+try.LatencyMS)
		}
	}
	if at[lab.PhaseReplay] < at[lab.PhaseCommit] {
		t.Errorf("the replay is drawn at %.3f ms, before the commit it read (%.3f ms)", at[lab.PhaseReplay], at[lab.PhaseCommit])
	}
}
