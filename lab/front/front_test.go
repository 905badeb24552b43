package front_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
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

// TestARunIsFoundWhicheverReplicaIsAsked: a run lives on the replica that
// ran it; through the front, its routes answer whichever replica the
// rotation would pick, and a run no replica knows is their 404.
func TestARunIsFoundWhicheverReplicaIsAsked(t *testing.T) {
	knows := func(name string, runs ...string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for _, run := range runs {
				if strings.HasPrefix(r.URL.Path, "/16/lab/runs/"+run) && r.Header.Get("Authorization") == "Bearer tok" {
					w.Header().Set("Content-Type", "application/x-ndjson")
					io.WriteString(w, name+" "+r.URL.Path)
					return
				}
			}
			if r.URL.Path == "/health" {
				return
			}
			http.Error(w, `{"code":"run_not_found"}`, http.StatusNotFound)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	a, b, c := knows("a"), knows("b", "run_1"), knows("c")
	f, err := front.New([]string{a.URL, b.URL, c.URL}, time.Hour, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	f.CheckOnce(context.Background())
	srv := httptest.NewServer(f.Handler())
	defer srv.Close()
	get := func(path string) (int, string, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
	}
	for range 3 {
		for _, path := range []string{"/16/lab/runs/run_1", "/16/lab/runs/run_1/history", "/16/lab/runs/run_1/history.html"} {
			if status, ct, body := get(path); status != http.StatusOK || body != "b "+path || ct != "application/x-ndjson" {
				t.Fatalf("%s: %d %q %q, want b's answer", path, status, ct, body)
			}
		}
	}
	if status, _, body := get("/16/lab/runs/run_2/history"); status != http.StatusNotFound || !strings.Contains(body, "run_not_found") {
		t.Fatalf("a run no replica knows: %d %s", status, body)
	}
}
