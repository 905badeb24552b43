package front_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/front"
)

// replica answers its name, and fails /health while sick.
func replica(t *testing.T, name string, sick *atomic.Bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && sick.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, name)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestRoundRobinSkipsUnhealthy(t *testing.T) {
	var sickA, sickB atomic.Bool
	a, b := replica(t, "a", &sickA), replica(t, "b", &sickB)
	f, err := front.New([]string{a.URL, b.URL}, time.Hour, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(f.Handler())
	defer srv.Close()
	seen := func(n int) map[string]int {
		out := map[string]int{}
		for range n {
			resp, err := http.Get(srv.URL + "/charges")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			out[string(body)]++
		}
		return out
	}
	f.CheckOnce(context.Background())
	if got := seen(4); got["a"] != 2 || got["b"] != 2 {
		t.Fatalf("healthy rotation %v, want a and b in turn", got)
	}
	sickB.Store(true)
	f.CheckOnce(context.Background())
	if got := seen(4); got["a"] != 4 {
		t.Fatalf("with b sick: %v, want only a", got)
	}
	sickB.Store(false)
	f.CheckOnce(context.Background())
	if got := seen(4); got["b"] != 2 {
		t.Fatalf("after b recovered: %v", got)
	}
}

func TestRejectsBadTargets(t *testing.T) {
	for _, targets := range [][]string{nil, {"not a url"}, {"127.0.0.1:8616"}} {
		if _, err := front.New(targets, time.Second, slog.New(slog.DiscardHandler)); err == nil {
			t.Errorf("front.New(%q) accepted", targets)
		}
	}
}
