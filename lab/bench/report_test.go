package bench

import (
	"math"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/cost"
)

// TestSerialBound checks the bound against the issue's own arithmetic.
func TestSerialBound(t *testing.T) {
	for _, tc := range []struct {
		http, store, want float64
	}{
		{24883, 49061, 16510},  // postgres replay beside a PK select
		{24883, 3048, 2716},    // postgres fresh, 1,000 accounts
		{24883, 110824, 20320}, // redis replay beside GET
		{1000, 1000, 500},      // two equal parts halve the rate
		{0, 1000, 0},           // a part unmeasured: no bound
		{1000, -1, 0},
	} {
		if got := serialBound(tc.http, tc.store); math.Abs(got-tc.want) > 1 {
			t.Errorf("serialBound(%v, %v) = %.1f, want %.0f", tc.http, tc.store, got, tc.want)
		}
	}
}

// TestBoundPairings sets the postgres and redis paths beside their serial
// bounds and marks the goals.
func TestBoundPairings(t *testing.T) {
	res := &Result{
		Phases: []*Phase{
			{Store: "postgres", Kind: FreshMany, Replicas: 1, Stats: Stats{Throughput: 1800}},
			{Store: "postgres", Kind: Replay, Replicas: 1, Stats: Stats{Throughput: 15000}},
			{Store: "redis", Kind: Replay, Replicas: 1, Stats: Stats{Throughput: 16000}},
			{Store: "memory", Kind: Replay, Replicas: 1, Stats: Stats{Throughput: 23000}},
		},
		Ceilings: []*Ceiling{
			{ID: EchoBare, Name: "bare Echo handler", PerSec: 25000, Status: Measured},
			{ID: PgFreshMany, Name: "pgbench fresh (1,000 accounts)", Tool: "pgbench", PerSec: 3000, Status: Measured},
			{ID: PgReplay, Name: "pgbench replay statements", Tool: "pgbench", PerSec: 50000, Status: Measured},
			{ID: RedisSetNX, Name: "redis-benchmark SET NX (key exists)", Tool: "redis-benchmark", Status: "not installed"},
		},
	}
	pair(res)
	find := func(p *Phase, prefix string) Pairing {
		for _, c := range p.Ceilings {
			if strings.HasPrefix(c.Name, prefix) {
				return c
			}
		}
		t.Fatalf("%s has no pairing %q: %+v", p.Path(), prefix, p.Ceilings)
		return Pairing{}
	}
	fresh := find(res.Phases[0], "serial bound")
	if b := 1 / (1/25000.0 + 1/3000.0); math.Abs(fresh.PerSec-b) > 0.01 || math.Abs(fresh.Ratio-1800/b) > 1e-9 {
		t.Errorf("postgres fresh bound %+v, want %.1f/s and ratio %.3f", fresh, b, 1800/b)
	}
	if fresh.HTTPPerSec != 25000 || fresh.StorePerSec != 3000 || !strings.Contains(fresh.ratioText(), "(below goal ≥ 0.85×)") {
		t.Errorf("postgres fresh bound %+v reads %q", fresh, fresh.ratioText())
	}
	if replay := find(res.Phases[1], "serial bound"); !strings.Contains(replay.ratioText(), "0.90× (meets goal ≥ 0.8×)") {
		t.Errorf("postgres replay bound reads %q", replay.ratioText())
	}
	for _, c := range res.Phases[2].Ceilings {
		if strings.HasPrefix(c.Name, "serial bound") {
			t.Errorf("redis replay has a bound without redis-benchmark: %+v", c)
		}
	}
	if echo := find(res.Phases[3], "bare Echo"); !strings.Contains(echo.ratioText(), "0.92× (meets goal ≥ 0.9×)") {
		t.Errorf("memory replay beside Echo reads %q", echo.ratioText())
	}
}

func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want Spread
		pct  float64
	}{
		{nil, Spread{}, 0},
		{[]float64{5}, Spread{Median: 5, Min: 5, Max: 5, N: 1}, 0},
		{[]float64{3, 1, 2}, Spread{Median: 2, Min: 1, Max: 3, N: 3}, 50},
		{[]float64{10, 40, 20, 30}, Spread{Median: 25, Min: 10, Max: 40, N: 4}, 60},
	} {
		got := spreadOf(tc.xs)
		if got != tc.want || math.Abs(got.Percent()-tc.pct) > 1e-9 {
			t.Errorf("spreadOf(%v) = %+v (±%.1f %%), want %+v (±%.1f %%)", tc.xs, got, got.Percent(), tc.want, tc.pct)
		}
	}
	xs := []float64{3, 1, 2}
	spreadOf(xs)
	if xs[0] != 3 {
		t.Errorf("spreadOf sorted its argument: %v", xs)
	}
}

// TestRounds sums two rounds up: each path's median and range, each ratio
// the median of the rounds' own, a phase beside its own round's ceiling.
func TestRounds(t *testing.T) {
	res := &Result{
		Repeat: 3, Connections: 16, Stores: []lab.StoreName{"memory"},
		Phases: []*Phase{
			{Store: "memory", Kind: Replay, Replicas: 1, Round: 1, Stats: Stats{Throughput: 18000, Latency: Latency{P50: 0.5, P99: 3}}},
			{Store: "memory", Kind: Replay, Replicas: 1, Round: 2, Stats: Stats{Throughput: 22000, Latency: Latency{P50: 0.4, P99: 2}}},
			{Store: "memory", Kind: Replay, Replicas: 1, Round: 3, Error: "boom"},
		},
		Ceilings: []*Ceiling{
			{ID: EchoBare, Name: "bare Echo handler", Round: 1, PerSec: 20000, Status: Measured},
			{ID: EchoBare, Name: "bare Echo handler", Round: 2, PerSec: 30000, Status: Measured},
			{ID: EchoBare, Name: "bare Echo handler", Round: 3, Status: "failed: no port"},
		},
	}
	conclude(res)
	if len(res.Paths) != 1 {
		t.Fatalf("paths %+v", res.Paths)
	}
	s := res.Paths[0]
	if s.Rounds != 2 || s.Failed != 1 || s.Throughput != (Spread{Median: 20000, Min: 18000, Max: 22000, N: 2}) || s.P99.Median != 2.5 {
		t.Errorf("path %+v", s)
	}
	// Round 1: 18,000 / 20,000 = 0.9; round 2: 22,000 / 30,000 = 0.733.
	if len(s.Ceilings) != 1 || math.Abs(s.Ceilings[0].Ratio-(0.9+22000.0/30000)/2) > 1e-9 || s.Ceilings[0].PerSec != 25000 {
		t.Fatalf("pairings %+v", s.Ceilings)
	}
	if r := s.Ceilings[0].Ratios; r == nil || r.N != 2 || math.Abs(r.Min-22000.0/30000) > 1e-9 || r.Max != 0.9 {
		t.Errorf("ratio spread %+v", r)
	}
	if len(res.CeilingSummaries) != 1 || res.CeilingSummaries[0].PerSec.Median != 25000 || res.CeilingSummaries[0].PerSec.N != 2 {
		t.Errorf("ceiling summaries %+v", res.CeilingSummaries)
	}
	var b strings.Builder
	if err := res.WriteTable(&b, true); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"range /s |", "| memory replay, 1 replica (!) |", "20,000 | 18,000–22,000 |",
		"0.82× (0.73–0.90) (below goal ≥ 0.9×)",
		"- (!) memory replay, 1 replica (round 3 of 3) could not run: boom",
		"- ceiling bare Echo handler, round 3: failed: no port",
		"- ceiling bare Echo handler: 25,000/s (median of 2 rounds, 20,000–30,000)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestAttemptGoals marks the 64-attempt runs' median wall time against the
// issue's targets: memory under 10 ms, postgres under 20 ms.
func TestAttemptGoals(t *testing.T) {
	res := &Result{Concurrent: []*Concurrent{
		{Store: "memory", Runs: 3, WallMS: []float64{12, 8, 9}, SpreadMS: []float64{1, 1, 1}},
		{Store: "postgres", Runs: 2, WallMS: []float64{30, 25}, SpreadMS: []float64{2, 2}},
		{Store: "redis", Runs: 1, WallMS: []float64{14}, SpreadMS: []float64{2}},
	}}
	for _, c := range res.Concurrent {
		c.summarise()
	}
	notes := strings.Join(res.notes(), "\n")
	for _, want := range []string{
		"on memory (`/charge-idempotent?attempts=64&key=fresh`), median of 3 runs: wall 9.00 ms (8.00 ms–12.0 ms; meets goal < 10.0 ms)",
		"on postgres (`/charge-idempotent?attempts=64&key=fresh`), median of 2 runs: wall 27.5 ms (25.0 ms–30.0 ms; above goal < 20.0 ms)",
		"on redis (`/charge-idempotent?attempts=64&key=fresh`), median of 1 runs: wall 14.0 ms, barrier",
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}

func TestTheTableShowsWhatAnOperationCost(t *testing.T) {
	effect := &cost.Counts{HTTPOut: map[string]float64{"POST /captures": 1}, HTTPIn: map[string]float64{"POST /webhooks/provider": 2},
		DurableCommits: map[string]float64{cost.Lab: 2, cost.Provider: 1}, AsyncCommits: map[string]float64{cost.Lab: 2}}
	res := &Result{Repeat: 1, Phases: []*Phase{{Store: "postgres", Kind: FreshMany, Replicas: 1, Round: 1,
		Cost:     &cost.Counts{DurableCommits: map[string]float64{cost.Lab: 1}, Statements: map[string]float64{cost.Lab: 8}},
		Delivery: &Delivery{Events: 10, Cost: effect}}}}
	var b strings.Builder
	if err := res.WriteTable(&b, true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| postgres fresh (1,000 accounts), 1 replica |", "| 1.00 + 0.00 |", "| postgres effect, settled", "| 3.00 ", "| 3.00 + 2.00 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, b.String())
		}
	}
}
