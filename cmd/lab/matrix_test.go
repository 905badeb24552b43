package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/history"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/redisdb"
	"github.com/idempotency-lab/lab/variants"
)

// TestMatrixOutputOffATerminal runs `lab matrix` with its output going to
// buffers, as in CI or a pipe: plain progress lines (no carriage returns),
// and n/a cells that say how to enable their store.
func TestMatrixOutputOffATerminal(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	args := []string{"matrix", "-format", "table", "-embedded-postgres", "off", "-embedded-redis", "off", "-database-url", "", "-redis-url", ""}
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("lab matrix: %v\n%s", err, stderr.String())
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
	// The progress counts the runs, not the cells that do not run.
	progress := regexp.MustCompile(`(?m)^matrix: (\d+)/(\d+) `).FindAllStringSubmatch(stderr.String(), -1)
	if strings.Contains(stderr.String(), "level=") {
		t.Errorf("log lines among the progress, for faults the matrix injects on purpose:\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), "\r") || len(progress) != ran || progress[0][0] != "matrix: 1/"+strconv.Itoa(ran)+" " {
		t.Fatalf("progress off a terminal, want %d lines counting to %d:\n%s", ran, ran, stderr.String())
	}
	for i, p := range progress {
		if p[1] != strconv.Itoa(i+1) || p[2] != strconv.Itoa(ran) {
			t.Fatalf("progress line %d says %s/%s, want %d/%d", i+1, p[1], p[2], i+1, ran)
		}
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

// TestMatrixFaultsAreNotIncidents: what the matrix's faults make happen
// on purpose — an answer the provider withholds, a paused worker fenced
// out — logs nothing at warn or above, so the matrix's progress shows no
// such line; the same failures without their fault still do.
func TestMatrixFaultsAreNotIncidents(t *testing.T) {
	t.Parallel()
	dbURL, schema := labtest.Postgres(t)
	var logs logLines
	a := startLab(t, func(c *app.Config) {
		c.DatabaseURL, c.PGSchema, c.FaultsEnabled = dbURL, schema, true
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		// A retry's capture slowed past the timeout by a loaded machine is
		// a real incident, logged as one: give the plain ones room.
		c.ProviderTimeout = 5 * time.Second
	})
	for _, run := range []string{ // the matrix's cells whose faults logged as incidents
		"/charge-unsafe?fault=applied_response_lost",
		"/charge-idempotent?store=phases&fault=applied_response_lost",
		"/charge-idempotent?store=lease&fault=stale_worker&work_ms=1500&ttl_ms=150",
		"/charge-idempotent?store=phases&fault=stale_worker&work_ms=1500&ttl_ms=150",
	} {
		r := labtest.Do(t, http.MethodGet, a.URL()+run+"&key=fresh", nil, "")
		if r.Status != http.StatusOK || strings.Contains(run, "stale_worker") && !strings.Contains(string(r.Body), `"fenced"`) {
			t.Fatalf("%s: %d, want a run whose stale worker was fenced out:\n%s", run, r.Status, r.Body)
		}
	}
	if logs.String() != "" {
		t.Errorf("injected faults logged as incidents:\n%s", logs.String())
	}

	// A failure the fault did not ask for: the store is not there.
	header := labtest.ChargeHeader(labtest.Acme, "k", http.Header{"Lab-Fault": {"applied_response_lost"}})
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/charges?store=redis", header, `{"account":"acct-1","amount_cents":100}`); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("a charge on a store that is not there: %d %s", r.Status, r.Body)
	}
	// A provider that does not answer, unasked.
	var down logLines
	b := startLab(t, func(c *app.Config) {
		c.ProviderURL, c.ProviderAPIKey, c.WebhookSecret = "http://127.0.0.1:1", "key", "secret"
		c.Logger = slog.New(slog.NewTextHandler(&down, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	labtest.Charge(t, b.URL(), "unsafe", labtest.Acme, "k", `{"account":"acct-1","amount_cents":100}`)
	for l, want := range map[*logLines]string{&logs: `level=ERROR msg="request failed"`, &down: `level=WARN msg="direct send to the provider failed`} {
		if !strings.Contains(l.String(), want) {
			t.Errorf("a real failure was not logged as one (%s):\n%s", want, l.String())
		}
	}
}

// logLines is a logger's output, written from the lab's goroutines.
type logLines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
