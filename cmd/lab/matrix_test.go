package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/history"
	"github.com/idempotency-lab/lab/lab/redisdb"
	"github.com/idempotency-lab/lab/variants"
)

// TestMatrixOutputOffATerminal runs `lab matrix` with its output going to
// buffers, as in CI or a pipe: plain progress lines (no carriage returns),
// and n/a cells that say how to enable their store.
func TestMatrixOutputOffATerminal(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"matrix", "-format", "table", "-embedded-postgres", "off", "-embedded-redis", "off"}
	t.Setenv("DATABASE_URL", "")
	t.Setenv("REDIS_URL", "")
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("lab matrix: %v\n%s", err, stderr.String())
	}
	cells := len(experiment.Cases()) * len(variants.Builtin())
	if strings.Contains(stderr.String(), "\r") || !strings.Contains(stderr.String(), fmt.Sprintf("matrix: 1/%d retries / unsafe\n", cells)) {
		t.Fatalf("progress off a terminal:\n%q", stderr.String())
	}
	out := stdout.String()
	free := 0 // the designs that need no service run…
	for _, v := range variants.Builtin() {
		if len(v.Needs) == 0 {
			free++
		}
	}
	ran := 0
	for _, c := range experiment.Cases() {
		if !c.NeedsPGPair { // …and keep no key in PostgreSQL to fail over
			ran += free
		}
	}
	if _, err := redisdb.FindServer(); err != nil {
		ran -= free // …but the Redis failover row needs redis-server
	}
	for _, want := range []string{"n/a: `redis` did not run here: set REDIS_URL", "n/a: `postgres` did not run here: set DATABASE_URL",
		"n/a: `lease` did not run here: set DATABASE_URL", "n/a: `redis+postgres` did not run here: set DATABASE_URL and REDIS_URL", fmt.Sprintf("\n%d runs in ", ran)} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestMatrixWriteRewritesTheReadme: -write replaces only what lies between
// the README's markers, with the markdown a run produced, and refuses a
// matrix with a cell that did not run or missed its usual verdict.
func TestMatrixWriteRewritesTheReadme(t *testing.T) {
	path := filepath.Join(t.TempDir(), "README.md")
	const head, tail = "# Lab\n\nbefore\n" + matrixBegin, matrixEnd + "\n\nafter\n"
	if err := os.WriteFile(path, []byte(head+"| old table |\n"+tail), 0o644); err != nil {
		t.Fatal(err)
	}
	cell := experiment.Cell{Store: "memory", Available: true, Verdict: lab.Holds, ExpectedVerdict: lab.Holds, Checked: history.Linearizable, MoneyHolds: true}
	mx := experiment.Matrix{Stores: []lab.StoreName{"memory"}, Rows: []experiment.Row{{Case: experiment.Cases()[0], Cells: []experiment.Cell{cell}}}}
	if err := writeReadme(path, mx); err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	if err := mx.WriteMarkdown(&table); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != head+table.String()+tail {
		t.Fatalf("README after -write:\n%s", got)
	}

	for name, c := range map[string]experiment.Cell{
		"not run":    {Store: "memory", HowToEnable: "set DATABASE_URL"},
		"unexpected": {Store: "memory", Available: true, Verdict: lab.Breaks, ExpectedVerdict: lab.Holds, Checked: history.Violation, MoneyHolds: true},
		"unproven":   {Store: "memory", Available: true, Verdict: lab.Breaks, ExpectedVerdict: lab.Breaks, Checked: history.Linearizable, MoneyHolds: true},
		"unchecked":  {Store: "memory", Available: true, Verdict: lab.Holds, ExpectedVerdict: lab.Holds, Checked: history.Unknown, MoneyHolds: true},
	} {
		mx.Rows[0].Cells[0] = c
		if err := writeReadme(path, mx); err == nil {
			t.Errorf("%s: a matrix with that cell was written", name)
		}
	}
	if got, _ := os.ReadFile(path); string(got) != head+table.String()+tail {
		t.Fatalf("a refused matrix changed the README:\n%s", got)
	}
	if _, err := spliceMatrix("# no markers\n", "| t |\n"); err == nil {
		t.Error("a README without markers was spliced")
	}
	if err := run(context.Background(), []string{"matrix", "-format", "table", "-write"}, io.Discard, io.Discard); err == nil {
		t.Error("-write accepted -format table")
	}
}

func TestHealthURL(t *testing.T) {
	for _, tc := range []struct{ addr, base, want string }{
		{"", "", "http://127.0.0.1:8616/health"},
		{"127.0.0.1:9000", "", "http://127.0.0.1:9000/health"},
		{"0.0.0.0:8701", "/16/", "http://127.0.0.1:8701/16/health"},
		{":8702", "", "http://127.0.0.1:8702/health"},
		{"[::1]:8703", "", "http://[::1]:8703/health"},
	} {
		if got := healthURL(tc.addr, tc.base); got != tc.want {
			t.Errorf("healthURL(%q, %q) = %q, want %q", tc.addr, tc.base, got, tc.want)
		}
	}
}
