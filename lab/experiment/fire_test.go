package experiment_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

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
