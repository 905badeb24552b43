package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants"
)

// TestSamplerReadsTheBooks samples real in-memory books on a clock of the
// test's own: the lag is the oldest pending event's age in the namespace,
// and delivered events and acknowledged webhooks are counted.
func TestSamplerReadsTheBooks(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := labtest.NewClock(start)
	books := inmem.NewBooks(clock.Now)
	ns := lab.Namespace("ns-bench")
	apply := func(id string, in lab.Namespace) {
		t.Helper()
		now := clock.Now()
		_, err := books.Apply(ctx, lab.Apply{
			Entry: lab.Entry{ChargeID: id, Namespace: in, Tenant: "acme", Account: "acct-1", AmountCents: 2500, Currency: "USD", CreatedAt: now},
			Event: &lab.Event{ID: "ev-" + id, Type: lab.EventReceiptEmail, ChargeID: id, Namespace: in, Tenant: "acme", State: lab.EventPending, NextAttempt: now, CreatedAt: now},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var hooks int64
	s := sampler{books: books, ns: ns, stepRun: "run-1", began: time.Now(),
		webhooks: func(_ context.Context, run string) (WebhookCounts, error) {
			if run != "run-1" {
				return WebhookCounts{}, fmt.Errorf("counted the webhooks of run %q, not the step's", run)
			}
			return WebhookCounts{Delivered: hooks}, nil
		}}

	if x, err := s.sample(ctx); err != nil || x.LagMS != 0 || x.Pending != 0 || x.Delivered != 0 {
		t.Fatalf("empty outbox: %+v, %v", x, err)
	}
	apply("c1", ns)
	clock.Advance(300 * time.Millisecond)
	apply("c2", ns)
	apply("other", "ns-other") // another namespace's, older than none of ours
	clock.Advance(200 * time.Millisecond)
	x, err := s.sample(ctx)
	if err != nil || x.LagMS != 500 || x.Pending != 2 || x.Delivered != 0 {
		t.Fatalf("two pending: %+v, %v; want lag 500 ms", x, err)
	}
	if b, err := s.backlog(ctx); err != nil || b.LagMS != 500 || b.Pending != 2 || b.Delivered != 0 || b.Webhooks != 0 {
		t.Fatalf("two pending, the backlog alone: %+v, %v; want lag 500 ms and nothing counted", b, err)
	}
	// The relay delivers the oldest: the lag is now the next one's age.
	claimed, err := books.ClaimDue(ctx, 1, time.Minute)
	if err != nil || len(claimed) != 1 || claimed[0].ChargeID != "c1" {
		t.Fatalf("claimed %+v, %v", claimed, err)
	}
	if err := books.MarkDelivered(ctx, claimed[0].ID, claimed[0].ClaimToken); err != nil {
		t.Fatal(err)
	}
	hooks = 2
	if x, err = s.sample(ctx); err != nil || x.LagMS != 200 || x.Pending != 1 || x.Delivered != 1 || x.Webhooks != 2 {
		t.Fatalf("one delivered: %+v, %v; want lag 200 ms", x, err)
	}
	if b, err := s.backlog(ctx); err != nil || b.LagMS != 200 || b.Pending != 1 || b.Delivered != 0 || b.Webhooks != 0 {
		t.Fatalf("one delivered, the backlog alone: %+v, %v; want lag 200 ms and nothing counted", b, err)
	}
}

// failingBooks fail every outbox read.
type failingBooks struct{ books }

func (failingBooks) OutboxStats(context.Context, lab.Namespace) (lab.OutboxStats, error) {
	return lab.OutboxStats{}, errors.New("no outbox")
}

func (failingBooks) OutboxBacklog(context.Context, lab.Namespace) (lab.OutboxBacklog, error) {
	return lab.OutboxBacklog{}, errors.New("no outbox")
}

// TestSamplerRuns samples on its beat until cancelled, and stops at the
// first error.
func TestSamplerRuns(t *testing.T) {
	s := sampler{books: books{}, began: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	got, err := s.run(ctx, 10*time.Millisecond)
	if err != nil || len(got) == 0 {
		t.Fatalf("%d samples, %v", len(got), err)
	}
	for i := 1; i < len(got); i++ {
		if got[i].AtMS < got[i-1].AtMS {
			t.Errorf("sample %d at %.1f ms, before %.1f ms", i, got[i].AtMS, got[i-1].AtMS)
		}
	}
	s.books = failingBooks{}
	if got, err := s.run(context.Background(), time.Millisecond); err == nil || !strings.Contains(err.Error(), "no outbox") || len(got) != 0 {
		t.Errorf("failing books: %d samples, %v", len(got), err)
	}
}

func TestLagOf(t *testing.T) {
	var samples []LagSample
	for i := range 100 {
		samples = append(samples, LagSample{LagMS: float64(100 - i)}) // 100 … 1, unsorted
	}
	if got := lagOf(samples); got != (Lag{P50: 50, P99: 99, Max: 100, Samples: 100}) {
		t.Errorf("lagOf(1..100) = %+v", got)
	}
	if got := lagOf([]LagSample{{LagMS: 0}, {LagMS: 30}, {LagMS: 1200}}); got != (Lag{P50: 30, P99: 1200, Max: 1200, Samples: 3}) {
		t.Errorf("three samples: %+v", got)
	}
	if got := lagOf(nil); got != (Lag{}) {
		t.Errorf("no samples: %+v", got)
	}
}

// TestSustainable picks the highest offered rate whose lag p99 stayed under
// a second, with its ledger check held.
func TestSustainable(t *testing.T) {
	ok := &Check{OK: true}
	step := func(offered, p99 float64, check *Check, e string) *SustainedStep {
		return &SustainedStep{OfferedPerSec: offered, Lag: Lag{P99: p99, Samples: 10}, Check: check, Error: e}
	}
	for _, tc := range []struct {
		name  string
		steps []*SustainedStep
		want  float64 // offered rate picked, 0 none
	}{
		{"the highest that held", []*SustainedStep{step(500, 80, ok, ""), step(800, 400, ok, ""), step(1000, 3000, ok, "")}, 800},
		{"a second is too much", []*SustainedStep{step(500, 999, ok, ""), step(800, 1000, ok, "")}, 500},
		{"a noisy step below does not hide one above", []*SustainedStep{step(500, 1500, ok, ""), step(800, 300, ok, "")}, 800},
		{"a failed ledger check does not count", []*SustainedStep{step(500, 80, ok, ""), step(800, 80, &Check{}, "")}, 500},
		{"nor a step that could not sample", []*SustainedStep{step(500, 80, ok, ""), step(800, 80, ok, "no outbox")}, 500},
		{"none held", []*SustainedStep{step(500, 5000, ok, "")}, 0},
		{"no steps", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := sustainable(tc.steps)
			switch {
			case tc.want == 0 && got != nil:
				t.Errorf("picked %+v, want none", got)
			case tc.want != 0 && (got == nil || got.OfferedPerSec != tc.want):
				t.Errorf("picked %+v, want the %.0f/s step", got, tc.want)
			}
		})
	}
	// No sample at all is no evidence of a bounded lag.
	if got := sustainable([]*SustainedStep{{OfferedPerSec: 500, Check: ok}}); got != nil {
		t.Errorf("a step without samples was picked: %+v", got)
	}
}

// TestSearchRate picks each next rate of the search for the sustainable
// rate from the steps before it and the relay's drain rate.
func TestSearchRate(t *testing.T) {
	ok := &Check{OK: true}
	step := func(offered, p99 float64) *SustainedStep {
		return &SustainedStep{OfferedPerSec: offered, Lag: Lag{P99: p99, Samples: 10}, Check: ok}
	}
	for _, tc := range []struct {
		name  string
		steps []*SustainedStep
		drain float64
		want  float64 // 0: no step
	}{
		{"no step yet: the drain rate", nil, 436, 436},
		{"no step and no drain: nothing to start from", nil, 0, 0},
		{"every fraction lagged: the drain rate, below half the lowest", []*SustainedStep{step(1155, 2000), step(1848, 2500)}, 436, 436},
		{"every fraction lagged: half the lowest, below the drain rate", []*SustainedStep{step(1155, 2000)}, 900, 578},
		{"the drain rate lagged too: half of it", []*SustainedStep{step(1155, 2000), step(436, 1500)}, 436, 218},
		{"between the two, geometrically", []*SustainedStep{step(1155, 2000), step(436, 1500), step(218, 300)}, 436, 308},
		{"every step held: twice the highest", []*SustainedStep{step(300, 100), step(400, 300)}, 400, 800},
		{"every step held: up to the most", []*SustainedStep{step(900, 100)}, 400, 1000},
		{"within 15 %: done", []*SustainedStep{step(300, 900), step(340, 1100)}, 400, 0},
		{"a failed ledger check tells nothing", []*SustainedStep{step(1155, 2000), {OfferedPerSec: 400, Lag: Lag{P99: 5000, Samples: 10}, Check: &Check{}}}, 436, 436},
		{"nor a step that could not sample", []*SustainedStep{{OfferedPerSec: 400, Error: "no outbox", Check: ok}}, 436, 436},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, found := searchRate(tc.steps, tc.drain, 1000)
			if tc.want == 0 {
				if found {
					t.Errorf("picked %.0f/s, want no step", got)
				}
				return
			}
			if !found || got != tc.want {
				t.Errorf("picked %.0f/s (%v), want %.0f/s", got, found, tc.want)
			}
		})
	}
}

// TestSustainedRates counts delivery over the load and settlement by the
// webhooks per event the whole step showed.
func TestSustainedRates(t *testing.T) {
	var x SustainedStep
	first := LagSample{AtMS: 0, Delivered: 100, Webhooks: 300}
	last := LagSample{AtMS: 2000, Delivered: 900, Webhooks: 1700}   // 800 delivered, 700 settled in 2 s
	after := LagSample{AtMS: 3000, Delivered: 1100, Webhooks: 2300} // 2 webhooks an event
	x.rates(first, last, after)
	if x.DeliveredPerSec != 400 || x.WebhooksPerEvent != 2 || x.SettledPerSec != 350 {
		t.Errorf("rates %+v", x)
	}
	var none SustainedStep
	none.rates(LagSample{Delivered: 1}, LagSample{AtMS: 1000, Delivered: 11}, LagSample{AtMS: 1500, Delivered: 11})
	if none.DeliveredPerSec != 10 || none.SettledPerSec != 0 {
		t.Errorf("without webhooks: %+v", none)
	}
}

// TestSustainedTable writes the sustained steps and what each store
// sustained.
func TestSustainedTable(t *testing.T) {
	ok := &Check{OK: true}
	res := &Result{Duration: 2 * time.Second, Sustained: []*Sustained{
		{Store: "memory", Replicas: 1, BasePerSec: 2000, SustainableFraction: 0.5, SustainableOffered: 1000, SustainablePerSec: 998, Steps: []*SustainedStep{
			{Fraction: 0.5, OfferedPerSec: 1000, Stats: Stats{Throughput: 998}, DeliveredPerSec: 990, SettledPerSec: 980, Lag: Lag{P50: 40, P99: 300, Max: 320, Samples: 20}, Check: ok,
				Samples: []LagSample{{AtMS: 0, OutboxMS: 4}, {AtMS: 100, OutboxMS: 6}, {AtMS: 250, OutboxMS: 30}}},
			{Fraction: 0.8, OfferedPerSec: 1600, Stats: Stats{Throughput: 1590}, DeliveredPerSec: 700, Lag: Lag{P50: 800, P99: 1800, Max: 1900, Samples: 20}, BacklogAtEnd: 1800, DrainMS: 2500, Check: ok},
		}},
		{Store: "postgres", Error: "no fresh (1,000 accounts) throughput on 1 replica to take fractions of"},
		{Store: "redis", Replicas: 1, BasePerSec: 1500, Steps: []*SustainedStep{
			{Fraction: 0.8, OfferedPerSec: 1200, Lag: Lag{P99: 200, Samples: 20}, Check: &Check{Failures: []string{"boom"}}},
		}},
		{Store: "lease", Replicas: 1, BasePerSec: 1000, DrainPerSec: 300, BoundPerSec: serialBound(1000, 300), SustainableFraction: 0.218, SustainableOffered: 218, SustainablePerSec: 217, Steps: []*SustainedStep{
			{Fraction: 0.1, OfferedPerSec: 100, Lag: Lag{P99: 1200, Samples: 20}, Check: ok}, // noise below the rate that held
			{Fraction: 0.5, OfferedPerSec: 500, Lag: Lag{P99: 1900, Samples: 20}, Check: ok},
			{Fraction: 0.436, OfferedPerSec: 436, Search: true, Lag: Lag{P99: 1500, Samples: 20}, Check: ok},
			{Fraction: 0.218, OfferedPerSec: 218, Search: true, Stats: Stats{Throughput: 217}, Lag: Lag{P99: 300, Samples: 20}, Check: ok},
		}},
	}}
	var b strings.Builder
	if err := res.WriteTable(&b, true); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| memory at 50 % of 2,000/s ",
		"| memory at 80 % of 2,000/s           |      1,600 |      1,590 |          700 |          — |  800 ms | 1,800 ms | 1,900 ms |   1,800 | 2,500 ms |",
		"| redis at 80 % of 1,500/s (ledger)   |",
		"- sustained memory (fresh 2,000/s on 1 replica): sustainable throughput 998/s, the 50 % step (offered 1,000/s), the highest whose lag p99 stayed under 1s (at 1,600/s it reached 1,800 ms); at 80 %, lag p99 1,800 ms (above goal < 1s); a read of the outbox took a median 6.00 ms, so its samples came every 125 ms (median)\n",
		"- sustained postgres: skipped: no fresh",
		"no step kept its lag p99 under 1s (and its ledger check): no sustainable throughput found; at 80 %, lag p99 200 ms (misses goal < 1s)",
		"- (ledger) sustained redis at 80 %: boom",
		"- ledger (sustained): 1 of 7 steps FAILED their check.",
		"| lease at 43.6 % of 1,000/s (search) |",
		"- sustained lease (fresh 1,000/s on 1 replica, its relay's drain to settlement 300/s): sustainable throughput 217/s, the 21.8 % step (offered 218/s), the highest whose lag p99 stayed under 1s (at 436/s it reached 1,500 ms); charges and their effects share the machine: at the rates each reached alone, together 1/(1/1,000 + 1/300) = 231/s (23.1 % of fresh)",
		"- sustained (search): after the fractions,",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if f := strings.Join(res.Failures(), "\n"); !strings.Contains(f, "sustained redis at 80 %: ledger check failed: boom") {
		t.Errorf("failures %q", f)
	}
}

// TestSustainedPhase runs a short bench of the memory store on a lab of
// its own: one sustained step at half the fresh throughput, with the relay
// running (not held) and the outbox sampled, held to the ledger. It
// asserts no speed.
func TestSustainedPhase(t *testing.T) {
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr = "127.0.0.1:0"
	cfg.EmbedPostgres, cfg.EmbedRedis, cfg.RedisPair = false, false, false
	a := labtest.Start(t, cfg)
	pub := a.Public()
	var mu sync.Mutex
	var holds []bool
	var calls []string // "hold", "resume" and "drop", in order
	res, err := Run(context.Background(), Config{
		Lab: Lab{URL: a.URL(), Token: pub.Token, Tenant: pub.Tenant, Namespace: pub.Namespace, Targets: a.Targets, Books: a.Books(),
			HoldDelivery: func(held bool) {
				mu.Lock()
				holds = append(holds, held)
				calls = append(calls, map[bool]string{true: "hold", false: "resume"}[held])
				mu.Unlock()
				a.HoldDelivery(held)
			},
			DropConnections: func() {
				mu.Lock()
				calls = append(calls, "drop")
				mu.Unlock()
				a.DropConnections()
			}},
		Duration: 300 * time.Millisecond, Connections: 4, Stores: []lab.StoreName{"memory"}, Replicas: []int{1}, Sustained: []float64{0.5}, SustainedSearch: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if f := res.Failures(); len(f) > 0 {
		t.Fatalf("failures: %v", f)
	}
	if len(res.Sustained) != 1 || len(res.Sustained[0].Steps) != 2 {
		t.Fatalf("sustained %+v: want the step at 50 %% and one of the search", res.Sustained)
	}
	s, x := res.Sustained[0], res.Sustained[0].Steps[0]
	// The search's step offers twice the rate that held, or less than the
	// one that lagged, and is held to the ledger as every step is.
	searched := s.Steps[1]
	if want, _ := searchRate(s.Steps[:1], 0, 4*s.BasePerSec); !searched.Search || x.Search || want == 0 ||
		(x.held() && searched.OfferedPerSec != want) || (!x.held() && searched.OfferedPerSec >= x.OfferedPerSec) {
		t.Errorf("search step %+v after %+v (want %.0f/s when the first held)", searched, x, want)
	}
	if searched.Check == nil || !searched.Check.OK || searched.Check.Charges == 0 {
		t.Errorf("search step's ledger check %+v", searched.Check)
	}
	if s.Error != "" || s.BasePerSec <= 0 || x.OfferedPerSec <= 0 || x.Requests == 0 {
		t.Errorf("sustained %+v, step %+v: it did not load", s, x)
	}
	if x.Check == nil || !x.Check.OK || x.Check.Charges != x.Check.Answered || x.Check.Charges == 0 {
		t.Errorf("ledger check %+v", x.Check)
	}
	if len(x.Samples) < 2 || x.Lag.Samples != len(x.Samples) {
		t.Errorf("%d samples, lag %+v", len(x.Samples), x.Lag)
	}
	// Only the fresh phases hold the relay: the sustained step runs with it.
	mu.Lock()
	defer mu.Unlock()
	fresh, held := 0, 0
	for _, p := range res.Phases {
		if p.Kind != Replay {
			fresh++
		}
	}
	for _, h := range holds {
		if h {
			held++
		}
	}
	if held != fresh || holds[len(holds)-1] {
		t.Errorf("holds %v for %d fresh phases: the sustained step held the relay", holds, fresh)
	}
	// Phases start from dropped connections; the sustained steps, a lab
	// under steady load, keep them: no drop after the first step resumed.
	last := -1
	for i, c := range calls {
		if c == "drop" {
			last = i
		}
	}
	if resumed := strings.Count(strings.Join(calls[last+1:], " "), "resume"); last < 0 || resumed != len(s.Steps) {
		t.Errorf("calls %v: want the phases' drops, then one resume per sustained step (%d) and no drop", calls, len(s.Steps))
	}
	// The bound beside the search: the fresh rate and the relay's drain,
	// each alone, taken together.
	if s.DrainPerSec <= 0 || s.BoundPerSec != serialBound(s.BasePerSec, s.DrainPerSec) {
		t.Errorf("drain %.0f/s, bound %.0f/s for fresh %.0f/s", s.DrainPerSec, s.BoundPerSec, s.BasePerSec)
	}
}
