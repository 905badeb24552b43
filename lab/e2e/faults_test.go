package e2e_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
)

func TestLostResponseAfterCommitReplays(t *testing.T) {
	t.Parallel()
	cfg := e2e.StoreConfig(t, postgres.Name)
	schema := cfg.PGSchema
	pool, err := pgxpool.New(context.Background(), cfg.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	a := labtest.Start(t, cfg)
	_, err = e2e.PostWithFault(a.URL(), postgres.Name, "k-lost", string(lab.FaultCrashAfterCharge))
	if err == nil || !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("want a dropped connection, got %v", err)
	}
	if n := e2e.KeyCharges(t, a, "acme", postgres.Name, "k-lost"); n != 1 {
		t.Fatalf("ledger after the lost response: %d charges, want 1 (committed)", n)
	}
	retry := labtest.Charge(t, a.URL(), postgres.Name, labtest.Acme, "k-lost", e2e.Body2500)
	if retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d replayed=%q %s", retry.Status, retry.Header.Get("Idempotent-Replayed"), retry.Body)
	}
	// The replay is the response committed with the charge: same id, same bytes.
	var id string
	var stored []byte
	err = pool.QueryRow(context.Background(), `SELECT c.id, r.response_body FROM `+schema+`.charges c
		JOIN `+schema+`.idempotency_requests r ON r.idempotency_key = c.idempotency_key AND r.tenant_id = c.tenant_id
		WHERE c.idempotency_key = 'k-lost'`).Scan(&id, &stored)
	if err != nil {
		t.Fatal(err)
	}
	if labtest.Decode[lab.Charge](t, retry).ID != id || string(retry.Body) != string(stored) {
		t.Fatalf("replay %s, committed charge %s with response %s", retry.Body, id, stored)
	}
	if n := e2e.KeyCharges(t, a, "acme", postgres.Name, "k-lost"); n != 1 {
		t.Fatalf("ledger after the retry: %d charges, want 1", n)
	}
}

func TestFaultsCanBeSwitchedOff(t *testing.T) {
	t.Parallel()
	a, err := app.Start(context.Background(), e2e.Config(func(c *app.Config) { c.FaultsEnabled = false }))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	resp, err := e2e.PostWithFault(a.URL(), memory.Name, "k-f", string(lab.FaultCrashAfterCharge))
	if err != nil || resp.Status != http.StatusBadRequest {
		t.Fatalf("fault header with faults off: %v %v", resp, err)
	}
	if r := labtest.Do(t, http.MethodGet, a.URL()+"/charge-idempotent?fault=slow", nil, ""); r.Status != http.StatusForbidden || labtest.Decode[lab.Problem](t, r).Code != "faults_disabled" {
		t.Fatalf("fault run with faults off: %d %s", r.Status, r.Body)
	}
	if n := e2e.KeyCharges(t, a, "acme", memory.Name, "k-f"); n != 0 {
		t.Fatalf("a refused fault charged %d times", n)
	}
	// Plain runs do not need faults.
	if rep := labtest.Get[experiment.Report](t, a.URL()+"/charge-idempotent?attempts=3&key=k-plain", ""); rep.Verdict != lab.Holds || rep.ChargesApplied != 1 {
		t.Fatalf("plain run with faults off: %+v", rep)
	}
	if rep := labtest.Get[experiment.Report](t, a.URL()+"/charge-unsafe?attempts=3&key=k-plain", ""); rep.Verdict != lab.Breaks || rep.ChargesApplied != 3 {
		t.Fatalf("plain unsafe run with faults off: %+v", rep)
	}
	resp, err = e2e.PostWithFault(labtest.Start(t, e2e.Config()).URL(), memory.Name, "k-f", "meteor")
	if err != nil || resp.Status != http.StatusBadRequest {
		t.Fatalf("unknown fault: %v %v", resp, err)
	}
}

// TestShutdownFinishesInFlight closes the lab while a slow charge is in
// flight: the charge completes and its client gets the answer.
func TestShutdownFinishesInFlight(t *testing.T) {
	t.Parallel()
	a, err := app.Start(context.Background(), e2e.Config())
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		resp labtest.Reply
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := e2e.PostWithFault(a.URL(), memory.Name, "k-shutdown", "slow; work_ms=400")
		done <- result{resp, err}
	}()
	e2e.WaitKeyState(t, a.URL(), labtest.Acme, memory.Name, "k-shutdown", lab.KeyInFlight) // the charge is in flight
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	r := <-done
	if r.err != nil || r.resp.Status != http.StatusCreated {
		t.Fatalf("in-flight charge during shutdown: %v %v", r.resp, r.err)
	}
	if n := e2e.KeyCharges(t, a, "acme", memory.Name, "k-shutdown"); n != 1 {
		t.Fatalf("ledger holds %d charges, want 1", n)
	}
}
