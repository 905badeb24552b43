package bench

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// books is a ledger of fixed charges: run -> charge ids, key -> charges.
type books struct {
	runs        map[string][]string
	keys        map[string]int
	undelivered int // of the run's events (one per charge), not delivered
}

func (f books) OpenRun(context.Context, lab.Namespace, string) error { return nil }

func (f books) RunStats(_ context.Context, _ lab.Namespace, run string) (lab.RunStats, error) {
	n := len(f.runs[run])
	return lab.RunStats{Charges: n, OutboxEvents: n, Delivered: n - f.undelivered}, nil
}

func (f books) KeyCharges(_ context.Context, _ string, _ lab.StoreName, key string) (lab.KeyTally, error) {
	return lab.KeyTally{Charges: f.keys[key]}, nil
}

func (f books) Payments(_ context.Context, _ lab.Namespace, run string, limit int) ([]lab.Payment, error) {
	var out []lab.Payment
	for _, id := range f.runs[run] {
		if len(out) == limit {
			break
		}
		out = append(out, lab.Payment{ChargeID: id, Run: run})
	}
	return out, nil
}

func (f books) OutboxStats(context.Context, lab.Namespace) (lab.OutboxStats, error) {
	return lab.OutboxStats{}, nil
}

func (f books) OutboxBacklog(context.Context, lab.Namespace) (lab.OutboxBacklog, error) {
	return lab.OutboxBacklog{}, nil
}

// TestChecksCatchWhatTheLedgerDisagreesWith feeds the checks ledgers that
// disagree with the answers: each must fail, saying how.
func TestChecksCatchWhatTheLedgerDisagreesWith(t *testing.T) {
	answered := map[string]string{"k1": "c1", "k2": "c2"}
	for _, tc := range []struct {
		name        string
		keyed       bool
		runs        []string
		keys        map[string]int
		undelivered int
		want        string // "" holds
	}{
		{"one charge per key", true, []string{"c1", "c2"}, map[string]int{"k1": 1, "k2": 1}, 0, ""},
		{"a key charged twice", true, []string{"c1", "c2", "c3"}, map[string]int{"k1": 2, "k2": 1}, 0, "3 charges of the run for 2 distinct keys"},
		{"a charge nobody was answered", true, []string{"c1", "c2", "c9"}, map[string]int{"k1": 1, "k2": 1}, 0, "no 201 answered"},
		{"an answered charge missing", true, []string{"c1"}, map[string]int{"k1": 1}, 0, "not in the ledger"},
		{"the same charge twice", true, []string{"c1", "c1"}, map[string]int{"k1": 1, "k2": 1}, 0, "more than once"},
		{"unsafe, one charge per 201", false, []string{"c1", "c2"}, nil, 0, ""},
		{"unsafe, a charge too many", false, []string{"c1", "c2", "c3"}, nil, 0, "3 charges of the run for 2 201 answers"},
		{"an event never delivered", true, []string{"c1", "c2"}, map[string]int{"k1": 1, "k2": 1}, 1, "2 events of the run, 1 delivered, for 2 charges"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &bencher{cfg: Config{Lab: Lab{Books: books{runs: map[string][]string{"r": tc.runs}, keys: tc.keys, undelivered: tc.undelivered}}}}
			c := b.checkFresh(context.Background(), &Phase{Store: "memory", Run: "r", keyed: tc.keyed}, len(answered), answered, nil)
			got := strings.Join(c.Failures, "; ")
			switch {
			case tc.want == "" && !c.OK:
				t.Errorf("failed: %s", got)
			case tc.want != "" && (c.OK || !strings.Contains(got, tc.want)):
				t.Errorf("ok=%v, failures %q, want one saying %q", c.OK, got, tc.want)
			}
		})
	}
	b := &bencher{cfg: Config{Lab: Lab{Books: books{runs: map[string][]string{"r": {"c1", "c2"}}}}}}
	if c := b.checkReplay(context.Background(), &Phase{Run: "r", Primed: 1, Replayed: 10}); c.OK {
		t.Error("a replay phase whose run charged twice for one priming charge held")
	}
	if c := b.checkReplay(context.Background(), &Phase{Run: "r", Primed: 2, Replayed: 10}); !c.OK {
		t.Errorf("two priming charges (a store per replica) failed: %v", c.Failures)
	}
}

func TestTable(t *testing.T) {
	res := &Result{
		Command: "go run ./cmd/lab bench -markdown", Connections: 16, Stores: []lab.StoreName{"memory", "redis", "postgres"},
		Phases: []*Phase{
			{Store: "memory", Kind: Replay, Replicas: 1, Stats: Stats{Requests: 100, Throughput: 20000, Latency: Latency{P50: 0.4, P99: 2}}},
			{Store: "redis", Kind: Replay, Replicas: 1, Stats: Stats{Requests: 100, Throughput: 13000, Latency: Latency{P50: 0.7, P99: 3}}},
			{Store: "memory", Kind: Replay, Replicas: 3, Stats: Stats{Requests: 100, Throughput: 18000, Non2xx: 3, StatusCodes: map[string]int{"201": 97, "503": 3}}},
			{Store: "postgres", Kind: FreshHot, Replicas: 1, Stats: Stats{Requests: 100, Throughput: 700}, Check: &Check{Failures: []string{"boom"}}},
		},
		Ceilings: []*Ceiling{
			{ID: EchoBare, Name: "bare Echo handler", PerSec: 40000, Status: Measured},
			{ID: RedisGet, Name: "redis-benchmark GET", Status: "not installed"},
			{ID: PgFreshHot, Name: "pgbench fresh (hot account)", PerSec: 1000, Status: Measured},
		},
	}
	conclude(res)
	var b strings.Builder
	if err := res.WriteTable(&b, true); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.HasPrefix(out, "```sh\ngo run ./cmd/lab bench -markdown\n```\n") {
		t.Errorf("markdown does not start with the command:\n%s", out)
	}
	width := -1
	for line := range strings.Lines(out) {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		if w := utf8.RuneCountInString(line); width == -1 {
			width = w
		} else if w != width {
			t.Errorf("row %q is %d wide, the header %d", line, w, width)
		}
	}
	for _, s := range []string{
		"| memory replay, 1 replica ", "bare Echo handler", "0.50×",
		"0.65× (meets goal ≥ 0.6×)", "not installed",
		"memory replay, 3 replicas (!)", "0.90×",
		"postgres fresh (hot account), 1 replica (ledger)", "0.70×",
		"- (!) memory replay, 3 replicas: 3 of 100 answers were not 2xx (503 ×3)",
		"- (ledger) postgres fresh (hot account), 1 replica: boom",
		"- ledger: 1 of 1 phases FAILED",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
	if f := res.Failures(); len(f) != 1 || !strings.Contains(f[0], "boom") {
		t.Errorf("failures %v", f)
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4500: "-4,500"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestCeilingTools runs the embedded pgbench scripts and redis-benchmark
// once, briefly, when the tools and services are here: the statements
// must still run against the lab's schema. It asserts no speed.
func TestCeilingTools(t *testing.T) {
	dbURL := labtest.ServiceURL(t, "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	b := &bencher{cfg: Config{ID: NewID(), Duration: 200 * time.Millisecond, Connections: 2, External: true, DatabaseURL: dbURL}}
	ceilings := b.pgbench(context.Background())
	if url, prefix, ok := labtest.OptionalRedis(t); ok {
		b.cfg.RedisURL, b.cfg.RedisPrefix = url, prefix
		ceilings = append(ceilings, b.redisBenchmark(context.Background())...)
	}
	for _, c := range ceilings {
		if c.Status == "not installed" {
			t.Logf("%s: %s", c.Name, c.Status)
			continue
		}
		if c.Status != Measured || c.PerSec <= 0 {
			t.Errorf("%s: %s (%.1f/s)", c.Name, c.Status, c.PerSec)
		}
	}
}
