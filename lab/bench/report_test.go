package bench

import (
	"math"
	"strings"
	"testing"
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
	if redis := find(res.Phases[2], "serial bound"); redis.Status != "needs redis-benchmark" || redis.Goal != redisReplayBoundGoal {
		t.Errorf("redis replay bound without redis-benchmark: %+v", redis)
	}
	if echo := find(res.Phases[3], "bare Echo"); !strings.Contains(echo.ratioText(), "0.92× (meets goal ≥ 0.9×)") {
		t.Errorf("memory replay beside Echo reads %q", echo.ratioText())
	}
}
