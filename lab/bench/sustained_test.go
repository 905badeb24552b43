package bench

import (
	"context"
	"errors"
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
	s := sampler{books: books, ns: ns, began: time.Now(),
		webhooks: func(context.Context) (WebhookCounts, error) { return WebhookCounts{Delivered: hooks}, nil }}

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
	}}
	var b strings.Builder
	if err := res.WriteTable(&b, true); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| memory at 50 % of 2,000/s ",
		"| memory at 80 % of 2,000/s         |      1,600 |      1,590 |          700 |          — |  800 ms | 1,800 ms | 1,900 ms |   1,800 | 2,500 ms |",
		"| redis at 80 % of 1,500/s (ledger) |",
		"- sustained memory (fresh 2,000/s on 1 replica): sustainable throughput 998/s, the 50 % step (offered 1,000/s), the highest whose lag p99 stayed under 1s; at 80 %, lag p99 1,800 ms (above goal < 1s); a read of the outbox took a median 6.00 ms, so its samples came every 125 ms (median)\n",
		"- sustained postgres: skipped: no fresh",
		"no step kept its lag p99 under 1s (and its ledger check): no sustainable throughput found; at 80 %, lag p99 200 ms (misses goal < 1s)",
		"- (ledger) sustained redis at 80 %: boom",
		"- ledger (sustained): 1 of 3 steps FAILED their check.",
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
	res, err := Run(context.Background(), Config{
		Lab: Lab{URL: a.URL(), Token: pub.Token, Tenant: pub.Tenant, Namespace: pub.Namespace, Targets: a.Targets, Books: a.Books(),
			HoldDelivery: func(held bool) {
				mu.Lock()
				holds = append(holds, held)
				mu.Unlock()
				a.HoldDelivery(held)
			}},
		Duration: 300 * time.Millisecond, Connections: 4, Stores: []lab.StoreName{"memory"}, Replicas: []int{1}, Sustained: []float64{0.5},
	})
	if err != nil {
		t.Fatal(err)
	}
	if f := res.Failures(); len(f) > 0 {
		t.Fatalf("failures: %v", f)
	}
	if len(res.Sustained) != 1 || len(res.Sustained[0].Steps) != 1 {
		t.Fatalf("sustained %+v", res.Sustained)
	}
	s, x := res.Sustained[0], res.Sustained[0].Steps[0]
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
}
