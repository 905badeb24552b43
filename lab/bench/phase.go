package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
	"github.com/idempotency-lab/lab/lab/cost"
)

// Phase is one loaded path: a store, a kind, a replica count.
type Phase struct {
	Store    lab.StoreName `json:"store"`
	Kind     Kind          `json:"kind"`
	Replicas int           `json:"replicas"`
	Round    int           `json:"round"` // 1 for the bench's first round
	Run      string        `json:"run"`   // the Lab-Run its charges carry in the ledger
	Targets  []string      `json:"targets"`
	Stats
	// Replay only: the answers that were (not) replays, and the replays
	// whose bytes differed from the key's first answer on that replica.
	Replayed     int `json:"replayed,omitempty"`
	NotReplayed  int `json:"not_replayed,omitempty"`
	BodyMismatch int `json:"body_mismatch,omitempty"`
	// Primed is how many charges priming the key made: one where the
	// replicas share the store, one per replica where each has its own.
	Primed int `json:"primed_charges,omitempty"`
	// SettleMS is how long the phase waited for the outbox to drain
	// before it began; PendingAtStart the events still pending then.
	SettleMS       float64 `json:"settle_ms"`
	PendingAtStart int     `json:"outbox_pending_at_start"`
	// Delivery is how the relay, held during a fresh phase, delivered the
	// phase's events once resumed.
	Delivery *Delivery `json:"delivery,omitempty"`
	// Cost is what one answered request of the phase asked of the lab's
	// dependencies, read from its /metrics (nil when it counts nothing).
	Cost *cost.Counts `json:"cost_per_request,omitempty"`
	// Check is what the ledger says of the phase's charges.
	Check *Check `json:"ledger_check,omitempty"`
	// Error says why the phase could not run.
	Error string `json:"error,omitempty"`
	// Ceilings are what the phase is compared with (filled in at the end).
	Ceilings []Pairing `json:"ceilings,omitempty"`

	keyed bool // the store dedupes on the key
}

// Delivery is the outbox drained after a fresh phase: its events delivered
// by the relay (and the provider's webhooks answered) in DrainMS.
type Delivery struct {
	Held    bool    `json:"held"` // the relay was held during the phase
	Events  int     `json:"events"`
	DrainMS float64 `json:"drain_ms"`
	PerSec  float64 `json:"per_s"`
	// Cost is what one event cost until settled (the bench's own polls of
	// the outbox count in its statements).
	Cost *cost.Counts `json:"cost_per_effect,omitempty"`
}

// Stats are one vegeta attack's figures.
type Stats struct {
	Requests    uint64         `json:"requests"`
	Throughput  float64        `json:"throughput_per_s"` // 2xx answers per second
	Success     float64        `json:"success_ratio"`
	StatusCodes map[string]int `json:"status_codes"`
	Non2xx      int            `json:"non_2xx"` // answers other than 2xx, transport errors included
	Errors      []string       `json:"errors,omitempty"`
	Latency     Latency        `json:"latency_ms"`
	// Vegeta is vegeta's own summary, as its JSON reporter writes it.
	Vegeta *vegeta.Metrics `json:"vegeta,omitempty"`
}

// Latency is a latency summary in milliseconds.
type Latency struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// Check is a phase held to the ledger.
type Check struct {
	OK bool `json:"ok"`
	// Answered is the requests answered 201; Keys the distinct keys among
	// them; Charges the ledger's charges carrying the phase's run.
	Answered int `json:"answered_201"`
	Keys     int `json:"distinct_keys,omitempty"`
	Charges  int `json:"ledger_charges"`
	// Sampled keys were also tallied one by one (Books.KeyCharges).
	Sampled  int      `json:"keys_tallied"`
	Failures []string `json:"failures,omitempty"`
}

// Path names the phase as the table shows it.
func (p *Phase) Path() string {
	var what string
	switch p.Kind {
	case FreshHot:
		what = "fresh (hot account)"
	case FreshMany:
		what = fmt.Sprintf("fresh (%s accounts)", thousands(Accounts))
	default:
		what = "replay"
	}
	return fmt.Sprintf("%s %s, %s", p.Store, what, plural(p.Replicas, "replica"))
}

// name is the path, with the phase's round when the bench has several.
func (p *Phase) name(rounds int) string { return p.Path() + roundSuffix(p.Round, rounds) }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// chargeBody is the charge every loaded request sends.
func chargeBody(account string) []byte {
	return []byte(`{"account":"` + account + `","amount_cents":2500}`)
}

// request is one charge as the load sends it.
type request struct {
	store   lab.StoreName
	token   string
	run     string
	key     string
	account string
}

func (r request) header() http.Header {
	h := http.Header{
		"Content-Type":    {"application/json"},
		"Idempotency-Key": {r.key},
		"Lab-Run":         {r.run},
	}
	if r.token != "" {
		h["Authorization"] = []string{"Bearer " + r.token}
	}
	return h
}

func chargeURL(base string, store lab.StoreName) string {
	return base + "/charges?store=" + url.QueryEscape(string(store))
}

// phase loads one path, then holds it to the ledger.
func (b *bencher) phase(ctx context.Context, p *Phase) error {
	targets, err := b.cfg.Lab.Targets(ctx, p.Replicas)
	if err != nil {
		return fmt.Errorf("bench: error getting %d replicas: %w", p.Replicas, err)
	}
	p.Targets = targets
	waited, pending, err := b.settle(ctx)
	if err != nil {
		return err
	}
	p.SettleMS, p.PendingAtStart = float64(waited.Microseconds())/1000, pending
	if err := b.cfg.Lab.Books.OpenRun(ctx, b.cfg.Lab.Namespace, p.Run); err != nil {
		return fmt.Errorf("bench: error opening run %s: %w", p.Run, err)
	}
	base := request{store: p.Store, token: b.cfg.Lab.Token, run: p.Run}
	if p.Kind == FreshHot || p.Kind == FreshMany {
		load := newFreshLoad(base, targets, p.Kind)
		hold := b.cfg.Lab.HoldDelivery
		if hold != nil {
			hold(true)
			defer hold(false)
		}
		before := b.costs(ctx)
		if err := b.attack(ctx, load.target, p.Run, vegeta.Rate{}, b.cfg.Duration, &p.Stats, load.observe); err != nil {
			return err
		}
		charged := b.costs(ctx)
		p.Cost = per(charged, before, load.count201)
		if hold != nil {
			hold(false)
		}
		// The relay delivers what the phase left; the ledger check then
		// finds every charge's event delivered.
		drained, _, err := b.settle(ctx)
		if err != nil {
			return err
		}
		p.Check = b.checkFresh(ctx, p, load.count201, load.answered, load.unreadable())
		if p.keyed && p.Check.Charges > 0 { // unsafe's effects bypass the outbox
			ms := float64(drained.Microseconds()) / 1000
			p.Delivery = &Delivery{Held: hold != nil, Events: p.Check.Charges, DrainMS: ms, PerSec: float64(p.Check.Charges) / max(ms/1000, 1e-3),
				Cost: per(b.costs(ctx), charged, p.Check.Charges)}
		}
		return nil
	}
	// Replay: the key is charged (on each replica, for a store whose
	// replicas keep their own keys) before the load starts, so every loaded
	// request should be answered from the store.
	r := base
	r.key, r.account = p.Run+"-replayed", "acct-1"
	primed := map[string][]byte{} // target URL -> the key's first answer there
	for _, t := range targets {
		u := chargeURL(t, p.Store)
		status, replayed, body, err := b.post(ctx, u, r.header(), chargeBody(r.account))
		switch {
		case err != nil:
			p.Error = fmt.Sprintf("priming the key on %s: %v", t, err)
			return nil
		case status != http.StatusCreated:
			p.Error = fmt.Sprintf("priming the key on %s answered %d: %s", t, status, body)
			return nil
		case !replayed:
			p.Primed++
		}
		primed[u] = body
	}
	if p.Store == "memory" && p.Replicas == 1 {
		b.replayBody = primed[chargeURL(targets[0], p.Store)]
	}
	var n atomic.Uint64
	tr := func(t *vegeta.Target) error {
		i := n.Add(1)
		t.Method, t.URL, t.Body, t.Header = http.MethodPost, chargeURL(targets[i%uint64(len(targets))], p.Store), chargeBody(r.account), r.header()
		return nil
	}
	observe := func(res *vegeta.Result) {
		if res.Code < 200 || res.Code > 299 {
			return
		}
		if res.Headers.Get("Idempotent-Replayed") != "true" {
			p.NotReplayed++
			return
		}
		p.Replayed++
		if !bytes.Equal(res.Body, primed[res.URL]) {
			p.BodyMismatch++
		}
	}
	before := b.costs(ctx)
	if err := b.attack(ctx, tr, p.Run, vegeta.Rate{}, b.cfg.Duration, &p.Stats, observe); err != nil {
		return err
	}
	p.Cost = per(b.costs(ctx), before, p.Replayed)
	p.Check = b.checkReplay(ctx, p)
	return nil
}

// freshLoad sends a new key with every request, round-robin over the
// targets, and keeps what the 201 answers named.
type freshLoad struct {
	base     request
	targets  []string
	kind     Kind
	n        atomic.Uint64
	answered map[string]string // key -> charge id, of the 201s
	count201 int
	unread   int    // 201s naming no key or no charge id
	example  []byte // the first of them
}

func newFreshLoad(base request, targets []string, kind Kind) *freshLoad {
	return &freshLoad{base: base, targets: targets, kind: kind, answered: map[string]string{}}
}

// target is the load's vegeta.Targeter.
func (l *freshLoad) target(t *vegeta.Target) error {
	i := l.n.Add(1)
	r := l.base
	r.key = l.base.run + "-" + strconv.FormatUint(i, 10)
	r.account = "acct-1"
	if l.kind == FreshMany {
		r.account = "acct-" + strconv.Itoa(1+rand.IntN(Accounts))
	}
	t.Method, t.URL, t.Body, t.Header = http.MethodPost, chargeURL(l.targets[i%uint64(len(l.targets))], r.store), chargeBody(r.account), r.header()
	return nil
}

// observe reads one answer (vegeta's results come one at a time).
func (l *freshLoad) observe(r *vegeta.Result) {
	if r.Code != http.StatusCreated {
		return
	}
	l.count201++
	key, _, err := wire.ParseKeyHeader(r.Headers.Values(lab.KeyHeader))
	var c struct {
		ID string `json:"id"`
	}
	if err == nil {
		err = json.Unmarshal(r.Body, &c)
	}
	if err != nil || key == "" || c.ID == "" {
		if l.unread++; l.example == nil {
			l.example = r.Body
		}
		return
	}
	l.answered[key] = c.ID
}

// unreadable is the failure the ledger check reports for 201s it could
// not match to a charge.
func (l *freshLoad) unreadable() []string {
	if l.unread == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%d answers 201 named no key or no charge id (such as %q)", l.unread, l.example)}
}

// costs reads the lab's counts of what it asked of its dependencies; nil
// when they cannot be read.
func (b *bencher) costs(ctx context.Context) *cost.Counts {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.cfg.Lab.URL+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	c, err := cost.Parse(resp.Body)
	if err != nil || len(c.Statements) == 0 && c.RedisTrips == 0 {
		return nil
	}
	return &c
}

// per is the cost of one of n operations between two readings.
func per(after, before *cost.Counts, n int) *cost.Counts {
	if after == nil || before == nil || n == 0 {
		return nil
	}
	c := after.Per(*before, n)
	return &c
}

// maxSettle bounds the wait for the outbox to drain, unless the phases are
// so long that the relay needs longer for one's events: with its default
// settings it delivers a few hundred a second, a quarter of what a fresh
// phase can charge, so a 5 s phase's events take up to half a minute.
const maxSettle = 2 * time.Minute

// settle waits until the relay has delivered every pending event of the
// namespace and the provider has sent its webhooks (bounded by maxSettle),
// so the work an earlier phase left behind does not slow this one: each
// phase bears only its own.
func (b *bencher) settle(ctx context.Context) (waited time.Duration, pending int, err error) {
	return b.settleThen(ctx, true)
}

// settleThen is settle; with drop false it keeps the lab's connections
// open once the outbox has drained.
func (b *bencher) settleThen(ctx context.Context, drop bool) (waited time.Duration, pending int, err error) {
	began := time.Now()
	for {
		// The backlog alone: a poll every 50 ms that counted every
		// delivered event would load the drain it waits for.
		read := time.Now()
		st, err := b.cfg.Lab.Books.OutboxBacklog(ctx, b.cfg.Lab.Namespace)
		if err != nil {
			return time.Since(began), 0, fmt.Errorf("bench: error reading the outbox: %w", err)
		}
		// The provider's queue is asked only once the outbox is empty,
		// when its webhooks are what is left (an external provider's
		// count is its stats, which sum every record it keeps).
		var queued int64
		if q := b.cfg.Lab.QueuedWebhooks; q != nil && st.Pending == 0 {
			if queued, err = q(ctx); err != nil {
				return time.Since(began), 0, fmt.Errorf("bench: error reading the provider's webhook queue: %w", err)
			}
		}
		if st.Pending == 0 && queued == 0 || time.Since(began) > max(maxSettle, 20*b.cfg.Duration) {
			if d := b.cfg.Lab.DropConnections; drop && d != nil {
				d()
			}
			return time.Since(began), st.Pending, nil
		}
		// At most a third of the time in reads, however long they take.
		if err := lab.Sleep(ctx, max(50*time.Millisecond, 2*time.Since(read))); err != nil {
			return time.Since(began), st.Pending, fmt.Errorf("bench interrupted: %w", err)
		}
	}
}

// post sends one charge and reads its answer.
func (b *bencher) post(ctx context.Context, u string, h http.Header, body []byte) (status int, replayed bool, answer []byte, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return 0, false, nil, fmt.Errorf("error building the request: %w", err)
	}
	req.Header = h
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, false, nil, fmt.Errorf("error sending the charge: %w", err)
	}
	defer resp.Body.Close()
	answer, err = io.ReadAll(resp.Body)
	if err != nil {
		return 0, false, nil, fmt.Errorf("error reading the answer: %w", err)
	}
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", answer, nil
}

// attack runs one vegeta attack on at most Connections connections for d
// and summarises it; observe sees every result as it arrives. A zero rate
// sends as fast as answers come back; a rate paces the requests, and when
// every connection waits on an answer the pacer waits too, so the rate
// sent can fall short of the one asked.
func (b *bencher) attack(ctx context.Context, tr vegeta.Targeter, name string, rate vegeta.Rate, d time.Duration, s *Stats, observe func(*vegeta.Result)) error {
	c := b.cfg.Connections
	// A transport of our own, so its idle connections can be closed after.
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: c,
	}
	defer transport.CloseIdleConnections()
	atk := vegeta.NewAttacker(
		vegeta.Client(&http.Client{Transport: transport, Timeout: 30 * time.Second}),
		vegeta.Workers(uint64(c)), vegeta.MaxWorkers(uint64(c)), vegeta.Connections(c), vegeta.KeepAlive(true),
	)
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()
	var m vegeta.Metrics
	for r := range atk.Attack(tr, rate, d, name) {
		m.Add(r)
		if observe != nil {
			observe(r)
		}
		r.Body = nil
	}
	m.Close()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bench interrupted: %w", err)
	}
	s.summarise(&m)
	return nil
}

func (s *Stats) summarise(m *vegeta.Metrics) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	s.Vegeta = m
	s.Requests = m.Requests
	s.Throughput = m.Throughput
	s.Success = m.Success
	s.StatusCodes = m.StatusCodes
	s.Errors = m.Errors
	s.Latency = Latency{Mean: ms(m.Latencies.Mean), P50: ms(m.Latencies.P50), P90: ms(m.Latencies.P90), P99: ms(m.Latencies.P99), Max: ms(m.Latencies.Max)}
	ok := 0
	for code, n := range m.StatusCodes {
		if strings.HasPrefix(code, "2") && len(code) == 3 {
			ok += n
		}
	}
	s.Non2xx = int(m.Requests) - ok
}

// checkFresh holds a fresh phase to the ledger. With a key to dedupe on:
// each key answered 201 has exactly one charge, and the run's charges are
// exactly the charges answered, one per key. Without (unsafe): the run's
// charges are exactly the 201 answers.
func (b *bencher) checkFresh(ctx context.Context, p *Phase, count201 int, answered map[string]string, bad []string) *Check {
	c := &Check{Answered: count201, Failures: bad}
	if p.keyed {
		c.Keys = len(answered)
	}
	books := b.cfg.Lab.Books
	stats, err := books.RunStats(ctx, b.cfg.Lab.Namespace, p.Run)
	if err != nil {
		c.Failures = append(c.Failures, err.Error())
		return c
	}
	c.Charges = stats.Charges
	// Every charge of a keyed store wrote one outbox event, which the relay
	// delivered once the phase settled. (unsafe sends its effects at once,
	// outside any transaction: that is its lesson.)
	if p.keyed && (stats.OutboxEvents != stats.Charges || stats.Delivered != stats.Charges) {
		c.Failures = append(c.Failures, fmt.Sprintf("the outbox holds %d events of the run, %d delivered, for %d charges", stats.OutboxEvents, stats.Delivered, stats.Charges))
	}
	want, what := count201, "201 answers"
	if p.keyed {
		want, what = len(answered), "distinct keys answered 201"
	}
	if c.Charges != want {
		c.Failures = append(c.Failures, fmt.Sprintf("the ledger holds %d charges of the run for %d %s", c.Charges, want, what))
	}
	// The listing matches charges to answers one by one: an answered charge
	// missing from the ledger, or one the ledger holds twice, or a charge
	// nobody was answered.
	rows, err := books.Payments(ctx, b.cfg.Lab.Namespace, p.Run, c.Charges+1)
	if err != nil {
		c.Failures = append(c.Failures, err.Error())
		return c
	}
	inLedger := make(map[string]int, len(rows))
	for _, r := range rows {
		inLedger[r.ChargeID]++
	}
	var missing, twice, unanswered int
	ids := make(map[string]bool, len(answered))
	for _, id := range answered {
		ids[id] = true
		switch inLedger[id] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	for id := range inLedger {
		if !ids[id] {
			unanswered++
		}
	}
	if len(ids) != len(answered) {
		c.Failures = append(c.Failures, fmt.Sprintf("%d keys were answered with another key's charge", len(answered)-len(ids)))
	}
	if missing > 0 {
		c.Failures = append(c.Failures, fmt.Sprintf("%d charges answered 201 are not in the ledger", missing))
	}
	if twice > 0 {
		c.Failures = append(c.Failures, fmt.Sprintf("%d charges are in the ledger more than once", twice))
	}
	if unanswered > 0 {
		c.Failures = append(c.Failures, fmt.Sprintf("the ledger holds %d charges of the run that no 201 answered", unanswered))
	}
	if p.keyed {
		// And, key by key, for a sample: the tally the lab's own runs use.
		keys := make([]string, 0, len(answered))
		for k := range answered {
			keys = append(keys, k)
		}
		rand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for _, k := range keys[:min(len(keys), 32)] {
			t, err := books.KeyCharges(ctx, b.cfg.Lab.Tenant, p.Store, k)
			if err != nil {
				c.Failures = append(c.Failures, err.Error())
				break
			}
			c.Sampled++
			if t.Charges != 1 {
				c.Failures = append(c.Failures, fmt.Sprintf("key %s has %d charges", k, t.Charges))
			}
		}
	}
	c.OK = len(c.Failures) == 0
	return c
}

// checkReplay holds a replay phase to the ledger: the run's only charges
// are the ones priming the key made; no loaded request charged.
func (b *bencher) checkReplay(ctx context.Context, p *Phase) *Check {
	c := &Check{Answered: p.Replayed + p.NotReplayed}
	stats, err := b.cfg.Lab.Books.RunStats(ctx, b.cfg.Lab.Namespace, p.Run)
	if err != nil {
		c.Failures = append(c.Failures, err.Error())
		return c
	}
	c.Charges = stats.Charges
	if c.Charges != p.Primed {
		c.Failures = append(c.Failures, fmt.Sprintf("the ledger holds %d charges of the run, %d of them before the load: replays charged", c.Charges, p.Primed))
	}
	if p.NotReplayed > 0 {
		c.Failures = append(c.Failures, fmt.Sprintf("%d answers to a completed key were not replays", p.NotReplayed))
	}
	if p.BodyMismatch > 0 {
		c.Failures = append(c.Failures, fmt.Sprintf("%d replays differed from the key's first answer", p.BodyMismatch))
	}
	c.OK = len(c.Failures) == 0
	return c
}
