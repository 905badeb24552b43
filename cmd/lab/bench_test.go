package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/bench"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// TestBenchSmoke runs `lab bench -smoke` as the command does, on memory and
// unsafe, and on postgres and redis when the test binary has them (a
// schema and a key prefix of the test's own). It holds the run to what the
// bench promises: every phase ran, every ledger check held, every path
// moved. It never asserts a speed: the machine decides those.
func TestBenchSmoke(t *testing.T) {
	t.Parallel()
	stores := []lab.StoreName{"unsafe", "memory"}
	out := filepath.Join(t.TempDir(), "bench.json")
	args := []string{"bench", "-smoke", "-json", out, "-embedded-postgres", "off", "-embedded-redis", "off"}
	if dbURL, schema, ok := labtest.OptionalPostgres(t); ok {
		args = append(args, "-database-url", dbURL, "-pg-schema", schema)
		stores = append(stores, "postgres")
	}
	if redisURL, prefix, ok := labtest.OptionalRedis(t); ok {
		args = append(args, "-redis-url", redisURL, "-redis-prefix", prefix)
		stores = append(stores, "redis")
	}
	var names []string
	for _, s := range stores {
		names = append(names, string(s))
	}
	args = append(args, "-stores", strings.Join(names, ","))

	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("lab %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res bench.Result
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatalf("decoding %s: %v", out, err)
	}
	if f := res.Failures(); len(f) > 0 {
		t.Fatalf("failures: %v", f)
	}
	if len(res.Skipped) != 1 || res.Skipped[0].Store != "unsafe" || res.Skipped[0].Kind != bench.Replay {
		t.Errorf("skipped %+v, want only unsafe's replay (it has no key)", res.Skipped)
	}
	// Each store: both fresh paths and (with a key) the replay, on 1 and 3 replicas.
	want := 2 * (3*len(stores) - 1)
	if len(res.Phases) != want {
		t.Errorf("%d phases, want %d", len(res.Phases), want)
	}
	for _, p := range res.Phases {
		switch {
		case p.Error != "":
			t.Errorf("%s: %s", p.Path(), p.Error)
		case p.Check == nil || !p.Check.OK:
			t.Errorf("%s: ledger check %+v", p.Path(), p.Check)
		case p.Requests == 0 || p.Throughput <= 0:
			t.Errorf("%s: %d requests, %.1f/s: the path did not move", p.Path(), p.Requests, p.Throughput)
		case p.Kind != bench.Replay && p.Check.Charges != p.Check.Answered:
			t.Errorf("%s: %d charges for %d answers", p.Path(), p.Check.Charges, p.Check.Answered)
		case p.Kind == bench.Replay && (p.Replayed == 0 || p.NotReplayed != 0):
			t.Errorf("%s: %d replays, %d answers not replayed", p.Path(), p.Replayed, p.NotReplayed)
		}
	}
	if len(res.Ceilings) == 0 || res.Ceilings[0].ID != bench.EchoBare || res.Ceilings[0].PerSec <= 0 {
		t.Errorf("the bare Echo ceiling was not measured: %+v", res.Ceilings)
	}
	for _, c := range res.Ceilings[1:] { // smoke: no pgbench, no redis-benchmark
		if c.Status == bench.Measured {
			t.Errorf("smoke measured %s", c.Name)
		}
	}
	if len(res.Concurrent) != len(stores) {
		t.Errorf("64-attempt runs on %d stores, want %d", len(res.Concurrent), len(stores))
	}
	for _, c := range res.Concurrent {
		if c.Error != "" || c.Runs != 2 || c.MedianWallMS <= 0 {
			t.Errorf("64-attempt runs on %s: %+v", c.Store, c)
		}
	}
	table := stdout.String()
	for _, s := range []string{"| path ", "memory replay, 3 replicas", "bare Echo handler", "ledger: all "} {
		if !strings.Contains(table, s) {
			t.Errorf("table lacks %q:\n%s", s, table)
		}
	}
	if strings.Contains(stderr.String(), "\r") || !strings.Contains(stderr.String(), "bench: 1/") {
		t.Errorf("progress off a terminal:\n%q", stderr.String())
	}
}

// TestBenchMarkdownReproduces checks the markdown table starts with the
// command that reproduces it, secrets and passwords hidden.
func TestBenchMarkdownReproduces(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "postgres://lab:s3cret@db:5432/x?sslmode=disable", "LAB_ADMIN_TOKEN": "hush"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	got := reproduce("bench", []string{"-duration", "3s", "-markdown", "-webhook-secret", "w", "-redis-url=redis://:pw@r:6379/0", "-stores", "redis+postgres"}, lookup)
	for _, s := range []string{"s3cret", "hush", " w ", ":pw@"} {
		if strings.Contains(got, s) {
			t.Errorf("%q shows %q", got, s)
		}
	}
	for _, s := range []string{"DATABASE_URL='postgres://lab:xxxxx@db:5432/x?sslmode=disable'", "LAB_ADMIN_TOKEN='…'",
		"go run ./cmd/lab bench -duration 3s -markdown -webhook-secret '…' -redis-url=redis://:xxxxx@r:6379/0 -stores redis+postgres"} {
		if !strings.Contains(got, s) {
			t.Errorf("%q lacks %q", got, s)
		}
	}
}

func TestBenchFlags(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "-stores", "nosuch"},
		{"bench", "-replicas", "0"},
		{"bench", "-replicas", "one"},
		{"bench", "-connections", "0"},
		{"bench", "extra"},
		{"bench", "-sustained-search", "-1"},
		{"bench", "-sustained-search", "11"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, &stdout, &stderr); err == nil {
			t.Errorf("lab %v: no error", args)
		}
	}
}
