package app_test

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// TestFaults reproduces, from real runs, where each store holds and breaks.
// Every case reads the ledger, not the report alone.
func TestFaults(t *testing.T) {
	a := labtest.Start(t, fullConfig(t))
	cases := []struct {
		name, store, query string
		charges            func(n int) bool
		want               string
		verdict            string
	}{
		{"RedisTTLShorterThanWork", lab.StoreRedis, "fault=slow&work_ms=300&ttl_ms=100&attempts=4", func(n int) bool { return n > 1 }, "> 1", "breaks"},
		{"RedisTTLLongerThanWork", lab.StoreRedis, "fault=slow&work_ms=100&ttl_ms=1000&attempts=4", is(1), "1", "holds"},
		{"RedisCrashAfterCharge", lab.StoreRedis, "fault=crash_after_charge&ttl_ms=300&attempts=3", is(2), "2", "breaks"},
		{"PostgresCrashAfterCharge", lab.StorePostgres, "fault=crash_after_charge&attempts=3", is(1), "1", "holds"},
		{"MemoryCrashAfterCharge", lab.StoreMemory, "fault=crash_after_charge&attempts=3", is(2), "2", "breaks"},
		{"RedisStoreRestart", lab.StoreRedis, "fault=store_restart&attempts=3", is(2), "2", "breaks"},
		{"MemoryStoreRestart", lab.StoreMemory, "fault=store_restart&attempts=3", is(2), "2", "breaks"},
		{"PostgresStoreRestart", lab.StorePostgres, "fault=store_restart&attempts=3", is(1), "1", "holds"},
		{"PostgresCrashAfterClaim", lab.StorePostgres, "fault=crash_after_claim&attempts=3", is(1), "1", "holds"},
		{"RedisCrashAfterClaim", lab.StoreRedis, "fault=crash_after_claim&ttl_ms=300&attempts=3", is(1), "1", "holds"},
		{"MemoryCrashAfterClaim", lab.StoreMemory, "fault=crash_after_claim&attempts=3", is(1), "1", "holds"},
		{"PostgresOutboxFail", lab.StorePostgres, "fault=outbox_fail&attempts=3", is(1), "1", "holds"},
		{"MemoryOutboxFail", lab.StoreMemory, "fault=outbox_fail&attempts=3", is(1), "1", "holds"},
		{"RedisOutboxFail", lab.StoreRedis, "fault=outbox_fail&attempts=3", is(1), "1", "holds"},
		{"UnsafeExpired", lab.StoreUnsafe, "fault=expired&window_ms=100&attempts=2", is(2), "2", "breaks"},
		{"MemoryExpired", lab.StoreMemory, "fault=expired&window_ms=100&attempts=2", is(2), "2", "breaks"},
		{"RedisExpired", lab.StoreRedis, "fault=expired&window_ms=100&attempts=2", is(2), "2", "breaks"},
		{"PostgresExpired", lab.StorePostgres, "fault=expired&window_ms=100&attempts=2", is(2), "2", "breaks"},
		{"PostgresExpiredWithOrderID", lab.StorePostgres, "fault=expired&window_ms=100&attempts=2&order_id=ord-1", is(1), "1", "holds"},
		{"MemoryReused", lab.StoreMemory, "scenario=reused&attempts=3", is(1), "1", "holds"},
		{"RedisReused", lab.StoreRedis, "scenario=reused&attempts=3", is(1), "1", "holds"},
		{"PostgresReused", lab.StorePostgres, "scenario=reused&attempts=3", is(1), "1", "holds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := "k-" + tc.name
			rep := labRun(t, a.URL(), tc.store, fmt.Sprintf("key=%s&%s", key, tc.query))
			n := keyCharges(t, a, "acme", tc.store, key)
			if !tc.charges(n) {
				t.Fatalf("ledger holds %d charges, want %s; report: %v", n, tc.want, rep["explanation"])
			}
			if rep["verdict"] != tc.verdict || rep["key_charges"] != float64(n) {
				t.Fatalf("report says %v with %v charges; ledger %d, want %s", rep["verdict"], rep["key_charges"], n, tc.verdict)
			}
			if rep["explanation"] == "" || rep["expected_verdict"] != tc.verdict {
				t.Fatalf("explanation %q, expected verdict %v", rep["explanation"], rep["expected_verdict"])
			}
		})
	}
}

func is(want int) func(int) bool { return func(n int) bool { return n == want } }

// TestRunsAreJudgedByWhatTheyAdd: a run on a key with history is judged by
// the charges it added, and a fault run on such a key says the fault had
// nothing to act on instead of explaining a crash that never happened.
func TestRunsAreJudgedByWhatTheyAdd(t *testing.T) {
	a := labtest.Start(t, fullConfig(t))
	if rep := labRun(t, a.URL(), lab.StoreMemory, "key=k-hist&fault=store_restart&attempts=2"); rep["verdict"] != "breaks" {
		t.Fatalf("store_restart: %v", rep["verdict"])
	}
	rep := labRun(t, a.URL(), lab.StoreMemory, "key=k-hist&attempts=5")
	if rep["verdict"] != "holds" || rep["charges_applied"] != float64(0) || rep["key_charges"] != float64(2) || rep["duplicates_applied"] != float64(0) {
		t.Fatalf("plain run on a key with two old charges: %v %v/%v: %v", rep["verdict"], rep["charges_applied"], rep["key_charges"], rep["reason"])
	}
	labRun(t, a.URL(), lab.StorePostgres, "key=k-twice&fault=crash_after_claim&attempts=3")
	rep = labRun(t, a.URL(), lab.StorePostgres, "key=k-twice&fault=crash_after_claim&attempts=3")
	if rep["verdict"] != "inconclusive" || !strings.Contains(rep["reason"].(string), "fresh key") {
		t.Fatalf("fault run on a completed key: %v: %v", rep["verdict"], rep["reason"])
	}
}

// labRun fires a lab run and returns its report.
func labRun(t *testing.T, base, store, query string) map[string]any {
	t.Helper()
	route := "/charge-idempotent?store=" + store + "&"
	if store == lab.StoreUnsafe {
		route = "/charge-unsafe?"
	}
	r := labtest.Do(t, http.MethodGet, base+route+query, nil, "")
	if r.Status != http.StatusOK {
		t.Fatalf("run %s: %d %s", query, r.Status, r.Body)
	}
	return r.JSON(t)
}

func TestRedisCrashAfterClaimWaitsForTTL(t *testing.T) {
	cfg := fullConfig(t)
	cfg.InFlightWait = 100 * time.Millisecond // shorter than the claim TTL, so the client sees the 409s
	a := labtest.Start(t, cfg)
	rep := labRun(t, a.URL(), lab.StoreRedis, "key=k-stuck&fault=crash_after_claim&ttl_ms=1500&attempts=2")
	if rep["key_after_fault"] != lab.KeyInFlight {
		t.Fatalf("after the crash the claim is %v, want it stuck in flight", rep["key_after_fault"])
	}
	retry := rep["timeline"].([]any)[1].(map[string]any)["tries"].([]any)
	first, last := retry[0].(map[string]any), retry[len(retry)-1].(map[string]any)
	if first["status"] != float64(http.StatusConflict) || last["status"] != float64(http.StatusCreated) {
		t.Fatalf("retry tries %v: want 409 until the TTL, then 201", retry)
	}
	if n := keyCharges(t, a, "acme", lab.StoreRedis, "k-stuck"); n != 1 {
		t.Fatalf("ledger holds %d charges, want 1", n)
	}
}

func TestOutboxFailureReports(t *testing.T) {
	a := labtest.Start(t, fullConfig(t))
	for _, store := range []string{lab.StoreMemory, lab.StoreRedis, lab.StorePostgres} {
		rep := labRun(t, a.URL(), store, "key=k-ofail-"+store+"&fault=outbox_fail&attempts=2")
		if rep["key_after_fault"] != lab.KeyAbsent {
			t.Errorf("%s: claim after the failed write is %v, want released", store, rep["key_after_fault"])
		}
		first := rep["timeline"].([]any)[0].(map[string]any)["tries"].([]any)[0].(map[string]any)
		if first["status"] != float64(http.StatusServiceUnavailable) || first["code"] != "charge_failed" {
			t.Errorf("%s: the faulted attempt got %v", store, first)
		}
		if rep["charges_applied"] != float64(1) || rep["side_effects_emitted"] != float64(1) {
			t.Errorf("%s: %v charges, %v effects; want 1 and 1", store, rep["charges_applied"], rep["side_effects_emitted"])
		}
		tries := rep["timeline"].([]any)[1].(map[string]any)["tries"].([]any)
		if last := tries[len(tries)-1].(map[string]any); last["status"] != float64(http.StatusCreated) || last["replayed"] == true {
			t.Errorf("%s: the retry got %v, want a fresh 201", store, last)
		}
	}
	rep := labRun(t, a.URL(), lab.StoreUnsafe, "key=k-ofail-unsafe&fault=outbox_fail&attempts=2")
	if rep["charges_applied"] != float64(2) || rep["receipts_missing"] != float64(1) || rep["side_effect_transport"] != "direct" {
		t.Fatalf("unsafe: %v charges, %v receipts missing", rep["charges_applied"], rep["receipts_missing"])
	}
}

// TestMatrix runs the breakage matrix once and checks its verdicts against
// the brief's lesson and its markdown against the README's copy.
func TestMatrix(t *testing.T) {
	a := labtest.Start(t, fullConfig(t))
	m, err := a.Server().Matrix(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range m.Rows {
		for _, c := range row.Cells {
			if !c.Available {
				t.Errorf("%s: store %s unavailable", row.Case.Name, c.Store)
			}
		}
	}
	if bad := m.Mismatches(); len(bad) > 0 {
		t.Fatalf("verdicts differ from the lesson:\n%v", bad)
	}
	// The lesson, cell by cell: the brief's table and the fault issue's
	// acceptance list, written here rather than read from the code's own
	// expectations.
	const H, B = "holds", "breaks"
	want := map[string][4]string{ // unsafe, memory, redis, postgres
		"retries":            {B, H, H, H},
		"replicas":           {B, B, H, H},
		"slow_short_ttl":     {B, H, B, H},
		"slow_long_ttl":      {B, H, H, H},
		"crash_after_claim":  {B, H, H, H},
		"crash_after_charge": {B, B, B, H},
		"outbox_fail":        {B, H, H, H},
		"store_restart":      {B, B, B, H},
		"expired":            {B, B, B, B},
		"expired_order_id":   {H, H, H, H},
		"reused":             {B, H, H, H},
		"tenants":            {B, H, H, H},
	}
	if len(m.Rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(m.Rows), len(want))
	}
	for _, row := range m.Rows {
		for i, c := range row.Cells {
			if w := want[row.Case.Name][i]; c.Verdict != w {
				t.Errorf("%s/%s: %s, want %s (%d charges): %s", row.Case.Name, c.Store, c.Verdict, w, c.Charges, c.Explanation)
			}
		}
	}
	if m.WallMS > 60_000 {
		t.Errorf("matrix took %.0f ms", m.WallMS)
	}
	checkReadmeMatrix(t, m)
}

// checkReadmeMatrix fails when the README's matrix no longer matches what
// the lab produced (regenerate it with `go run ./cmd/lab matrix -format markdown`).
func checkReadmeMatrix(t *testing.T, m experiment.Matrix) {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "<!-- matrix:begin -->\n")
	documented, _, ok2 := strings.Cut(rest, "<!-- matrix:end -->")
	if !ok || !ok2 {
		t.Fatal("README.md lacks the matrix markers")
	}
	var produced strings.Builder
	if err := m.WriteMarkdown(&produced); err != nil {
		t.Fatal(err)
	}
	if produced.String() != documented {
		t.Fatalf("README's matrix differs from the lab's:\n--- README\n%s--- lab\n%s", documented, produced.String())
	}
}

// TestInProcessReplicas gives the same verdicts as three real processes
// (see cmd/lab's TestThreeProcesses): one charge per replica for memory.
func TestInProcessReplicas(t *testing.T) {
	a := labtest.Start(t, fullConfig(t))
	for store, want := range map[string]struct {
		charges int
		verdict string
	}{lab.StoreUnsafe: {9, "breaks"}, lab.StoreMemory: {3, "breaks"}, lab.StoreRedis: {1, "holds"}, lab.StorePostgres: {1, "holds"}} {
		key := "k-replicas-" + store
		rep := labRun(t, a.URL(), store, "replicas=3&attempts=9&key="+key)
		if n := keyCharges(t, a, "acme", store, key); n != want.charges || rep["replicas"] != float64(3) || rep["verdict"] != want.verdict {
			t.Errorf("%s: ledger holds %d charges over %v replicas (%v), want %d (%s)", store, n, rep["replicas"], rep["verdict"], want.charges, want.verdict)
		}
	}
}
