package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/bench"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// TestLoadSmoke runs `lab load -smoke` as the command does, on the test's
// PostgreSQL and Redis: every attendee walked every step of the path, every
// check held, and the report says so. It never asserts a speed.
func TestLoadSmoke(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "load.json")
	args := []string{"load", "-smoke", "-json", out, "-embedded-postgres", "off", "-embedded-redis", "off"}
	dbURL, schema := labtest.Postgres(t)
	redisURL, prefix := labtest.Redis(t)
	args = append(args, "-database-url", dbURL, "-pg-schema", schema, "-redis-url", redisURL, "-redis-prefix", prefix)

	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("lab %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res bench.WorkshopResult
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatalf("decoding %s: %v", out, err)
	}
	if f := res.Failures(); len(f) > 0 || res.FiveXX > 0 {
		t.Fatalf("failures: %v, %d answers 5xx", f, res.FiveXX)
	}
	if res.Attendees != 3 || len(res.WaitMS) != 3 || res.Fairness < 1 {
		t.Errorf("%d attendees, waits %v, fairness %.2f", res.Attendees, res.WaitMS, res.Fairness)
	}
	if len(res.Steps) != 17 {
		t.Errorf("%d steps, want the whole path's 17", len(res.Steps))
	}
	for _, s := range res.Steps {
		if s.Count != 3 || s.Errors != 0 {
			t.Errorf("%s: %d answers, %d errors; want one per attendee", s.Name, s.Count, s.Errors)
		}
	}
	for step, want := range map[string]lab.Verdict{"unsafe 5 attempts": lab.Breaks, "memory 5 attempts": lab.Holds,
		"memory 3 replicas": lab.Breaks, "postgres crash": lab.Holds} {
		if got := res.Alone[step]; got != want {
			t.Errorf("%s alone: %s, want %s", step, got, want)
		}
	}
	if res.Process.CPUSeconds <= 0 || res.Process.RSSMaxBytes <= 0 || res.PGOpen <= 0 {
		t.Errorf("the lab's use was not measured: %+v, %d PostgreSQL connections", res.Process, res.PGOpen)
	}
	table := stdout.String()
	for _, s := range []string{"| memory 5 attempts ", "| POST /charges ", "fairness (slowest ÷ median)", "Checks: every answer as expected"} {
		if !strings.Contains(table, s) {
			t.Errorf("table lacks %q:\n%s", s, table)
		}
	}
	// Before anything runs, what the load will do, from the figures it did it with.
	plan := bench.WorkshopPlan{Attendees: res.Attendees, Rounds: res.Rounds, Steps: len(res.Steps), Think: time.Duration(res.ThinkMS * float64(time.Millisecond))}
	if _, after, _ := strings.Cut(stderr.String(), "load: "); !strings.HasPrefix(after, plan.String()+"\n") {
		t.Errorf("the load's first line is not its plan %q:\n%s", plan.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), " attendees active, ") {
		t.Errorf("no progress on stderr:\n%s", stderr.String())
	}
}

// TestLoadRefusesBadFlags: each flag out of range is an error naming it,
// before any lab starts.
func TestLoadRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]string{
		"-attendees 0":             "-attendees must be in 1..1000",
		"-rounds -1":               "-rounds must not be negative",
		"-rounds 0":                "-rounds 0 needs a positive -duration",
		"-think -1s":               "-think must not be negative",
		"-attendees 2 -matrices 3": "-matrices must be in 0..2",
		"extra":                    "unexpected arguments",
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), append([]string{"load"}, strings.Fields(args)...), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("load %s: %v, want an error saying %q", args, err, want)
		}
	}
}
