package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idempotency-lab/lab/lab"
)

// MaxLag is the outbox lag a sustainable rate stays under: the oldest
// pending event's age, at the 99th percentile of the samples.
const MaxLag = time.Second

// lagEvery is how often a sustained step samples the outbox.
const lagEvery = 100 * time.Millisecond

// sustainedGoalFraction is the target: at this share of a store's
// fresh throughput, the lag p99 stays under MaxLag.
const sustainedGoalFraction = 0.8

// WebhookCounts are the provider's webhooks of the bench's namespace.
type WebhookCounts struct {
	Queued    int64 // still to send
	Delivered int64 // acknowledged by the lab
}

// Sustained is one store's sustained phase: fresh charges on Accounts
// accounts at fixed rates, each a fraction of the store's fresh
// throughput in the same bench, with the outbox relay running beside
// them, and the outbox's lag sampled while they run.
type Sustained struct {
	Store    lab.StoreName `json:"store"`
	Replicas int           `json:"replicas"`
	// BasePerSec is the store's fresh (1,000 accounts) throughput in this
	// bench, the median of its rounds: the rates are fractions of it.
	BasePerSec float64 `json:"base_per_s"`
	// DrainPerSec is the median rate at which the relay drained the same
	// fresh phases to settlement, alone on the machine; BoundPerSec what
	// the two come to together at those rates, 1/(1/BasePerSec +
	// 1/DrainPerSec): each charge costs its own work and its effects'. An
	// estimate, not a ceiling: a drain starts from the connections the
	// phase before dropped, with every relay worker it can grow, so the
	// search may find a higher rate. Zero when no drain was timed.
	DrainPerSec float64          `json:"drain_per_s,omitempty"`
	BoundPerSec float64          `json:"bound_per_s,omitempty"`
	Steps       []*SustainedStep `json:"steps"`
	// The sustainable throughput: the highest offered rate whose lag p99
	// stayed under MaxLag with its ledger check held, and the charge rate
	// that step achieved. Zero when no step did.
	SustainableFraction float64 `json:"sustainable_fraction,omitempty"`
	SustainableOffered  float64 `json:"sustainable_offered_per_s,omitempty"`
	SustainablePerSec   float64 `json:"sustainable_per_s,omitempty"`
	// Error says why the phase could not run.
	Error string `json:"error,omitempty"`
}

// SustainedStep is one fixed rate held for the phase duration.
type SustainedStep struct {
	Fraction      float64 `json:"fraction"`
	OfferedPerSec float64 `json:"offered_per_s"` // the pacer's rate
	// Search marks a step of the search for the sustainable rate: its
	// rate came from the steps before it, its fraction from the rate.
	Search bool   `json:"search,omitempty"`
	Run    string `json:"run"`
	// Stats are the attack's: Throughput is the charge rate achieved (2xx
	// answers per second); SentPerSec the rate vegeta sent at.
	Stats
	SentPerSec float64 `json:"sent_per_s"`
	// DeliveredPerSec is how many events the relay delivered per second
	// while the load ran; SettledPerSec how many were settled: their
	// capture's webhooks acknowledged by the lab, counted as the webhooks
	// acknowledged over WebhooksPerEvent, measured over the whole step.
	DeliveredPerSec  float64 `json:"delivered_per_s"`
	SettledPerSec    float64 `json:"settled_per_s,omitempty"`
	WebhooksPerEvent float64 `json:"webhooks_per_event,omitempty"`
	// Lag is the oldest pending event's age over the samples taken while
	// the load ran.
	Lag Lag `json:"outbox_lag_ms"`
	// BacklogAtEnd is the events pending when the load stopped; DrainMS
	// how long the relay and the provider then took to deliver them all.
	BacklogAtEnd int     `json:"backlog_at_end"`
	DrainMS      float64 `json:"drain_ms"`
	// Samples are the reads while the load ran: the first just before it,
	// the last once it stopped; only those two count the delivered events
	// and the webhooks too (the reads between read the backlog alone,
	// whose cost does not grow with what was delivered). Drained is the
	// read once the outbox had drained.
	Samples []LagSample `json:"samples"`
	Drained LagSample   `json:"drained"`
	Check   *Check      `json:"ledger_check,omitempty"`
	Error   string      `json:"error,omitempty"`
}

// Lag summarises the sampled outbox lag, in milliseconds.
type Lag struct {
	P50     float64 `json:"p50"`
	P99     float64 `json:"p99"`
	Max     float64 `json:"max"`
	Samples int     `json:"samples"`
}

// LagSample is one read of the outbox (and of the provider's webhooks).
type LagSample struct {
	AtMS      float64 `json:"at_ms"`  // since the step's first sample, just before its load
	LagMS     float64 `json:"lag_ms"` // the oldest pending event's age
	Pending   int     `json:"pending"`
	Delivered int     `json:"delivered,omitempty"` // the namespace's delivered events, all told: first, last and drained reads
	Webhooks  int64   `json:"webhooks_delivered,omitempty"`
	// How long the reads took: the outbox's and the provider's.
	OutboxMS   float64 `json:"outbox_read_ms"`
	WebhooksMS float64 `json:"webhooks_read_ms,omitempty"`
}

// sampler reads one namespace's outbox, and the provider's webhooks when
// it can count them.
type sampler struct {
	books    Ledger
	ns       lab.Namespace
	stepRun  string                                                       // the step's run, whose webhooks are counted
	webhooks func(ctx context.Context, run string) (WebhookCounts, error) // nil: not counted
	began    time.Time
}

// sample reads the outbox, its delivered events counted, and the
// provider's webhooks.
func (s sampler) sample(ctx context.Context) (LagSample, error) {
	out, err := s.outbox(ctx)
	if err != nil || s.webhooks == nil {
		return out, err
	}
	began := time.Now()
	w, err := s.webhooks(ctx, s.stepRun)
	if err != nil {
		return out, fmt.Errorf("error counting the provider's webhooks: %w", err)
	}
	out.Webhooks, out.WebhooksMS = w.Delivered, msOf(time.Since(began))
	return out, nil
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// backlog reads the outbox's backlog alone: a read between the first and
// the last, every lagEvery, that must not load what it measures.
func (s sampler) backlog(ctx context.Context) (LagSample, error) {
	began := time.Now()
	bl, err := s.books.OutboxBacklog(ctx, s.ns)
	if err != nil {
		return LagSample{}, fmt.Errorf("error reading the outbox's backlog: %w", err)
	}
	return LagSample{AtMS: msOf(began.Sub(s.began)), OutboxMS: msOf(time.Since(began)),
		LagMS: msOf(bl.OldestPendingAge), Pending: bl.Pending}, nil
}

// outbox reads the outbox, its delivered events counted.
func (s sampler) outbox(ctx context.Context) (LagSample, error) {
	began := time.Now()
	st, err := s.books.OutboxStats(ctx, s.ns)
	if err != nil {
		return LagSample{}, fmt.Errorf("error reading the outbox: %w", err)
	}
	out := LagSample{
		AtMS: msOf(began.Sub(s.began)), OutboxMS: msOf(time.Since(began)),
		LagMS: msOf(st.OldestPendingAge), Pending: st.Pending, Delivered: st.Delivered,
	}
	return out, nil
}

// run samples the outbox's backlog every `every` until ctx ends (a read
// that takes longer skips a beat), and returns the samples and the first
// error that was not ctx's. The delivered events and the provider's
// webhooks are counted only around the load: their counts are slower to
// read, and the lag needs only the backlog.
func (s sampler) run(ctx context.Context, every time.Duration) ([]LagSample, error) {
	var out []LagSample
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return out, nil
		case <-tick.C:
		}
		x, err := s.backlog(ctx)
		if ctx.Err() != nil {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, x)
	}
}

// lagOf summarises the samples' lag (nearest-rank percentiles).
func lagOf(samples []LagSample) Lag {
	if len(samples) == 0 {
		return Lag{}
	}
	lags := make([]float64, len(samples))
	for i, s := range samples {
		lags[i] = s.LagMS
	}
	slices.Sort(lags)
	rank := func(q float64) float64 { return lags[max(0, int(math.Ceil(q*float64(len(lags))))-1)] }
	return Lag{P50: rank(0.5), P99: rank(0.99), Max: lags[len(lags)-1], Samples: len(lags)}
}

// held reports whether the step kept the outbox's lag bounded.
func (s *SustainedStep) held() bool {
	return s.measured() && s.Lag.P99 < float64(MaxLag.Milliseconds())
}

// lagged reports whether the step ran and sampled a lag p99 of MaxLag or
// more: the relay fell behind the rate.
func (s *SustainedStep) lagged() bool {
	return s.measured() && s.Lag.P99 >= float64(MaxLag.Milliseconds())
}

// measured reports whether the step's lag tells anything: it ran, held
// to its ledger check and sampled the outbox.
func (s *SustainedStep) measured() bool {
	return s.Error == "" && s.Check != nil && s.Check.OK && s.Lag.Samples > 0
}

// sustainable picks the step with the highest offered rate that kept the
// lag bounded, nil when none did.
func sustainable(steps []*SustainedStep) *SustainedStep {
	var best *SustainedStep
	for _, s := range steps {
		if s.held() && (best == nil || s.OfferedPerSec > best.OfferedPerSec) {
			best = s
		}
	}
	return best
}

// sustainedSteps lists a store's sustained steps: one per fraction, then
// SustainedSearch steps whose rates the steps before them decide. The
// first to run finds the store's fresh throughput in the rounds run
// before.
func (b *bencher) sustainedSteps(st storeInfo, next func() string) []step {
	if len(b.cfg.Sustained) == 0 || !st.Available || !st.RequiresKey {
		return nil
	}
	s := &Sustained{Store: st.Name, Replicas: slices.Min(b.cfg.Replicas)}
	begun := false
	begin := func() {
		if begun {
			return
		}
		begun = true
		b.res.Sustained = append(b.res.Sustained, s)
		s.BasePerSec = b.freshThroughput(st.Name, s.Replicas)
		if s.DrainPerSec = b.drainRate(st.Name, s.Replicas); s.BasePerSec > 0 && s.DrainPerSec > 0 {
			s.BoundPerSec = serialBound(s.BasePerSec, s.DrainPerSec)
		}
		if s.BasePerSec <= 0 {
			s.Error = "no fresh (" + thousands(Accounts) + " accounts) throughput on " + plural(s.Replicas, "replica") + " to take fractions of"
		}
	}
	// runStep runs x at its offered rate and records what the store sustained.
	runStep := func(ctx context.Context, x *SustainedStep) error {
		s.Steps = append(s.Steps, x)
		if err := b.sustain(ctx, s, x); err != nil {
			return err
		}
		if best := sustainable(s.Steps); best != nil {
			s.SustainableFraction, s.SustainableOffered, s.SustainablePerSec = best.Fraction, best.OfferedPerSec, best.Throughput
		}
		return nil
	}
	var steps []step
	for _, f := range b.cfg.Sustained {
		steps = append(steps, step{label: fmt.Sprintf("sustained %s at %s of its fresh throughput", st.Name, percent(f)), run: func(ctx context.Context) error {
			if begin(); s.Error != "" {
				return nil
			}
			return runStep(ctx, &SustainedStep{Fraction: f, OfferedPerSec: math.Max(1, math.Round(f*s.BasePerSec)), Run: next()})
		}})
	}
	for range b.cfg.SustainedSearch {
		steps = append(steps, step{label: fmt.Sprintf("sustained %s, searching for the rate its relay keeps up with", st.Name), run: func(ctx context.Context) error {
			if begin(); s.Error != "" {
				return nil
			}
			rate, ok := searchRate(s.Steps, s.DrainPerSec, 4*s.BasePerSec)
			if !ok {
				return nil // nothing left between a rate that held and one that did not
			}
			return runStep(ctx, &SustainedStep{Fraction: math.Round(1000*rate/s.BasePerSec) / 1000, OfferedPerSec: rate, Search: true, Run: next()})
		}})
	}
	return steps
}

// searchClose is how near the lowest rate that lagged may come to the
// highest that held before the search stops: within it, one more step
// would tell less than the machine's noise.
const searchClose = 1.15

// searchRate picks the next rate of a store's search for its sustainable
// rate, from the steps run so far: halfway (geometrically) between the
// highest offered rate that held and the lowest whose lag did not; below
// the lowest that lagged, half of it, or the relay's drain rate when that
// is lower (with charges beside it, the relay drains no faster than
// alone); with no step yet, the drain rate; above the highest that held,
// twice it, up to most. Steps that could not run, or failed their ledger
// check, tell nothing of the lag. It reports false when the two are
// within searchClose of each other, or when the rate was offered before.
func searchRate(steps []*SustainedStep, drain, most float64) (float64, bool) {
	held, lagged := 0.0, math.Inf(1)
	for _, x := range steps {
		switch {
		case x.held():
			held = math.Max(held, x.OfferedPerSec)
		case x.lagged():
			lagged = math.Min(lagged, x.OfferedPerSec)
		}
	}
	var rate float64
	switch {
	case held == 0 && math.IsInf(lagged, 1):
		if drain <= 0 {
			return 0, false
		}
		rate = drain
	case held == 0:
		rate = lagged / 2
		if drain > 0 {
			rate = math.Min(rate, drain)
		}
	case math.IsInf(lagged, 1):
		rate = math.Min(2*held, most)
	default:
		if lagged/held < searchClose {
			return 0, false
		}
		rate = math.Sqrt(held * lagged)
	}
	rate = math.Max(1, math.Round(rate))
	if rate <= held || rate >= lagged || slices.ContainsFunc(steps, func(x *SustainedStep) bool { return x.OfferedPerSec == rate }) {
		return 0, false // nothing between them, or a step that could not tell: the same rate would not either
	}
	return rate, true
}

// drainRate is the median rate at which the relay drained the store's
// fresh (Accounts accounts) phases on that many replicas to settlement,
// with no charge beside it: 0 when none was timed.
func (b *bencher) drainRate(store lab.StoreName, replicas int) float64 {
	var xs []float64
	for _, p := range b.res.Phases {
		if p.Store == store && p.Kind == FreshMany && p.Replicas == replicas && p.Delivery != nil && p.Delivery.PerSec > 0 {
			xs = append(xs, p.Delivery.PerSec)
		}
	}
	return median(xs)
}

// freshThroughput is the median fresh (Accounts accounts) throughput of
// the store's phases on that many replicas that ran.
func (b *bencher) freshThroughput(store lab.StoreName, replicas int) float64 {
	var xs []float64
	for _, p := range b.res.Phases {
		if p.Store == store && p.Kind == FreshMany && p.Replicas == replicas && p.Error == "" && p.Check != nil && p.Check.OK {
			xs = append(xs, p.Throughput)
		}
	}
	return median(xs)
}

// sustain runs one step: from a drained outbox, fresh charges at the
// step's rate with the relay running, the outbox sampled meanwhile; then
// the drain, timed, and the ledger check.
func (b *bencher) sustain(ctx context.Context, s *Sustained, x *SustainedStep) error {
	targets, err := b.cfg.Lab.Targets(ctx, s.Replicas)
	if err != nil {
		return fmt.Errorf("bench: error getting %d replicas: %w", s.Replicas, err)
	}
	if hold := b.cfg.Lab.HoldDelivery; hold != nil {
		hold(false) // the point: the relay delivers while the charges come
	}
	// A sustained step is a lab under steady load, so its connections stay
	// open between steps: dropped, as before a phase, every step began
	// with new database sessions preparing their statements again while
	// the charges came, and the relay fell behind on that alone (memory at
	// 20 and 40 % of its fresh rate: 66 and 45 events/s delivered after a
	// drop, 148 and 216 without).
	if _, _, err := b.settleThen(ctx, false); err != nil {
		return err
	}
	ns := b.cfg.Lab.Namespace
	if err := b.cfg.Lab.Books.OpenRun(ctx, ns, x.Run); err != nil {
		return fmt.Errorf("bench: error opening run %s: %w", x.Run, err)
	}
	sm := sampler{books: b.cfg.Lab.Books, ns: ns, stepRun: x.Run, webhooks: b.cfg.Lab.Webhooks, began: time.Now()}
	first, err := sm.sample(ctx)
	if err != nil {
		x.Error = err.Error()
		return nil
	}
	load := newFreshLoad(request{store: s.Store, token: b.cfg.Lab.Token, run: x.Run}, targets, FreshMany)
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var during []LagSample
	var sampleErr error
	wg.Go(func() { during, sampleErr = sm.run(sctx, lagEvery) })
	rate := vegeta.Rate{Freq: int(x.OfferedPerSec), Per: time.Second}
	attackErr := b.attack(ctx, load.target, x.Run, rate, b.cfg.Duration, &x.Stats, load.observe)
	stop()
	wg.Wait()
	if attackErr != nil {
		return attackErr
	}
	if x.Vegeta != nil {
		x.SentPerSec = x.Vegeta.Rate
	}
	last, err := sm.sample(ctx)
	if err = errors.Join(sampleErr, err); err != nil {
		x.Error = err.Error()
	}
	x.Samples = append(append([]LagSample{first}, during...), last)
	x.Lag, x.BacklogAtEnd = lagOf(x.Samples), last.Pending
	drained, _, err := b.settleThen(ctx, false)
	if err != nil {
		return err
	}
	x.DrainMS = float64(drained.Microseconds()) / 1000
	after, err := sm.sample(ctx)
	if err != nil && x.Error == "" {
		x.Error = err.Error()
	}
	x.Drained = after
	x.rates(first, last, after)
	x.Check = b.checkFresh(ctx, &Phase{Store: s.Store, Kind: FreshMany, Run: x.Run, keyed: true}, load.count201, load.answered, load.unreadable())
	return nil
}

// rates sets the delivery and settlement rates over the load, from the
// samples before it, as it stopped, and once the outbox had drained.
func (x *SustainedStep) rates(first, last, after LagSample) {
	secs := (last.AtMS - first.AtMS) / 1000
	if secs <= 0 {
		return
	}
	x.DeliveredPerSec = float64(last.Delivered-first.Delivered) / secs
	events, hooks := after.Delivered-first.Delivered, after.Webhooks-first.Webhooks
	if events <= 0 || hooks <= 0 {
		return // no webhooks to count settlement by
	}
	x.WebhooksPerEvent = float64(hooks) / float64(events)
	x.SettledPerSec = float64(last.Webhooks-first.Webhooks) / x.WebhooksPerEvent / secs
}

// percent writes a fraction as a percentage to a tenth: 0.8 is "80 %",
// 0.2184 "21.8 %".
func percent(f float64) string {
	return strconv.FormatFloat(math.Round(1000*f)/10, 'f', -1, 64) + " %"
}
