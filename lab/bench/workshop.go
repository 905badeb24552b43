package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// WorkshopConfig says what a workshop load does: Attendees simulated
// people, each joined with a token of its own, walking the README's path
// against one lab with think time between steps.
type WorkshopConfig struct {
	URL       string // the lab's base URL
	JoinCode  string // what POST /lab/join asks, if the lab set one
	Attendees int
	// Rounds is how many times each attendee walks the path; 0: until
	// Duration has passed (the round under way is finished).
	Rounds   int
	Duration time.Duration
	// Think is the mean pause between two steps; each pause is drawn
	// between half and one and a half of it from the seeded source, as is
	// each attendee's arrival within the first Think.
	Think time.Duration
	Seed  uint64
	// Matrices is how many attendees (the first ones) also fetch the
	// breakage matrix once, at the end of their first round. The matrix is
	// timed alone before the load as well.
	Matrices int
	// Connections, when set, counts the PostgreSQL connections open and
	// active; sampled as the load runs.
	Connections func(ctx context.Context) (open, active int, err error)
	// InProcess says the lab runs in this process: its CPU and memory
	// include the load generator's.
	InProcess bool
	Command   string // the command line that reproduces the load, for the report
	// Planned, when set, is told what the load will do before it starts.
	Planned  func(WorkshopPlan)
	Progress func(WorkshopProgress)
}

// WorkshopPlan is what a load will do, from the figures it runs with.
type WorkshopPlan struct {
	Attendees int
	Rounds    int           // 0: rounds until Duration has passed
	Duration  time.Duration // with Rounds 0
	Steps     int           // the path's, as this lab runs it
	Think     time.Duration
	Matrices  int
}

// Thinking is what one attendee is expected to spend not waiting on the
// lab: its arrival, drawn within the first Think, then a pause drawn
// around Think before each step; with Rounds 0, Duration and the round
// under way.
func (p WorkshopPlan) Thinking() time.Duration {
	rounds := p.Rounds
	if rounds == 0 {
		return p.Duration + time.Duration(p.Steps)*p.Think
	}
	return p.Think/2 + time.Duration(rounds*p.Steps)*p.Think
}

// WorkshopProgress is what the load prints every few seconds.
type WorkshopProgress struct {
	Elapsed  time.Duration
	Active   int
	Requests int
	Errors   int
	Shed     int
	P99MS    float64
}

// WorkshopResult is every figure of one workshop load.
type WorkshopResult struct {
	Command   string        `json:"command,omitempty"`
	Started   time.Time     `json:"started"`
	Elapsed   time.Duration `json:"elapsed_ns"`
	Attendees int           `json:"attendees"`
	Rounds    int           `json:"rounds,omitempty"`
	Duration  time.Duration `json:"duration_ns,omitempty"`
	ThinkMS   float64       `json:"think_ms"`
	Seed      uint64        `json:"seed"`
	Host      Host          `json:"host"`
	// Steps are the path's steps, in order, with the latency of every answer.
	Steps []*StepStats `json:"steps"`
	// Routes are the same answers grouped by route.
	Routes []*StepStats `json:"routes"`
	// WaitMS is each attendee's time waiting on the lab: its requests,
	// refusals waited out included, its thinking and its matrix not;
	// Fairness the slowest ÷ the median.
	WaitMS   []float64 `json:"attendee_wait_ms"`
	Fairness float64   `json:"fairness"`
	// MatrixAloneMS and MatrixLoadedMS are the matrix's wall time before
	// the load and under it (each matrix fetched).
	MatrixAloneMS  float64   `json:"matrix_alone_ms,omitempty"`
	MatrixLoadedMS []float64 `json:"matrix_loaded_ms,omitempty"`
	// Process is the lab's process as its /metrics reads.
	Process ProcessUse `json:"process"`
	// PGOpen and PGActive are the most PostgreSQL connections seen open
	// and active; -1 when not measured.
	PGOpen   int `json:"pg_connections_open"`
	PGActive int `json:"pg_connections_active"`
	// Alone is each run step's verdict when one attendee ran it alone.
	Alone map[string]lab.Verdict `json:"verdicts_alone"`
	// Wrong lists what the checks found: a verdict unlike the run's alone,
	// a ledger row of another tenant, an unexpected status, a 5xx.
	Wrong []string `json:"wrong,omitempty"`
	// Shed counts the answers shed, 429 or 503 with Retry-After, that the
	// attendees waited out and retried (the tables' "shed 503"); GaveUp
	// the steps an attendee gave up after maxRetries of them in a row;
	// Unannounced the 429s without Retry-After; FiveXX the other answers
	// 5xx, errors.
	Shed        int `json:"shed"`
	GaveUp      int `json:"steps_given_up"`
	Unannounced int `json:"refused_without_retry_after"`
	FiveXX      int `json:"status_5xx"`
}

// ProcessUse is the lab's process before and after the load.
type ProcessUse struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	CPUPerAttendee  float64 `json:"cpu_seconds_per_attendee"`
	CPUUtilisation  float64 `json:"cpu_cores_used"` // CPU seconds ÷ wall seconds
	RSSBeforeBytes  float64 `json:"rss_before_bytes"`
	RSSMaxBytes     float64 `json:"rss_max_bytes"`
	RSSPerAttendee  float64 `json:"rss_bytes_per_attendee"` // (max − before) ÷ attendees
	IncludesLoadGen bool    `json:"includes_load_generator"`
}

// StepStats are the answers of one step or route.
type StepStats struct {
	Name     string         `json:"name"`
	Count    int            `json:"count"`
	Errors   int            `json:"errors"`
	Shed     int            `json:"shed"`
	P50MS    float64        `json:"p50_ms"`
	P95MS    float64        `json:"p95_ms"`
	P99MS    float64        `json:"p99_ms"`
	MaxMS    float64        `json:"max_ms"`
	Statuses map[string]int `json:"statuses"`
	ms       []float64
}

// Failures lists what the checks found wrong; empty when the load held.
func (r *WorkshopResult) Failures() []string {
	out := slices.Clone(r.Wrong)
	if r.Unannounced > 0 {
		out = append(out, fmt.Sprintf("%d refusals without Retry-After", r.Unannounced))
	}
	return out
}

// An attendee as the lab joined it.
type attendee struct {
	Token        string        `json:"token"`
	Tenant       string        `json:"tenant"`
	SecondTenant string        `json:"second_tenant"`
	Namespace    lab.Namespace `json:"namespace"`
	n            int
	rng          *rand.Rand
}

// pathStep is one step of the README's path as an attendee takes it.
type pathStep struct {
	name, method, route string
	// target is the URL after the base, for attendee a in round r.
	target  func(a *attendee, round int) string
	body    string
	headers func(a *attendee, round int) http.Header
	want    int  // the status it answers
	run     bool // its answer is a lab run's report
	replay  bool // its answer says Idempotent-Replayed: true
	// stepCharges is what a stepped run's ledger holds at its end.
	stepCharges int
	passes      bool // its answer is a check's report that failed nothing
	store       lab.StoreName
}

func chargeKey(a *attendee, round int) string { return fmt.Sprintf("k-%d-%d", a.n, round) }

func fixed(target string) func(*attendee, int) string {
	return func(*attendee, int) string { return target }
}

// workshopPath is the README's path: the quickstart, the charge API, a bad
// request, the faulted runs, a stepped race, lab check, the page, the
// outbox. Steps of a store the lab lacks are left out.
func workshopPath(available func(lab.StoreName) bool) []pathStep {
	charge := func(a *attendee, round int) http.Header {
		return http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {chargeKey(a, round)}}
	}
	body := func(amount int) string { return `{"account":"acct-1","amount_cents":` + strconv.Itoa(amount) + `}` }
	steps := []pathStep{
		{name: "reset", method: http.MethodPost, route: "/reset-lab", target: fixed("/reset-lab"), want: http.StatusOK},
		{name: "unsafe 5 attempts", method: http.MethodGet, route: "/charge-unsafe", target: fixed("/charge-unsafe?attempts=5&key=fresh"), want: http.StatusOK, run: true, store: "unsafe"},
		{name: "memory 5 attempts", method: http.MethodGet, route: "/charge-idempotent", target: fixed("/charge-idempotent?store=memory&attempts=5&key=fresh"), want: http.StatusOK, run: true, store: "memory"},
		{name: "charge", method: http.MethodPost, route: "/charges", target: fixed("/charges?store=memory"), body: body(2500), headers: charge, want: http.StatusCreated, store: "memory"},
		{name: "charge replayed", method: http.MethodPost, route: "/charges", target: fixed("/charges?store=memory"), body: body(2500), headers: charge, want: http.StatusCreated, replay: true, store: "memory"},
		{name: "charge key reused", method: http.MethodPost, route: "/charges", target: fixed("/charges?store=memory"), body: body(9900), headers: charge, want: http.StatusUnprocessableEntity, store: "memory"},
		{name: "charge looked up", method: http.MethodGet, route: "/charges", target: func(a *attendee, round int) string {
			return "/charges?store=memory&key=" + url.QueryEscape(chargeKey(a, round))
		}, want: http.StatusOK, store: "memory"},
		{name: "bad amount", method: http.MethodGet, route: "/charge-idempotent", target: fixed("/charge-idempotent?amount=abc"), want: http.StatusBadRequest},
		{name: "memory 3 replicas", method: http.MethodGet, route: "/charge-idempotent", target: fixed("/charge-idempotent?store=memory&replicas=3&attempts=9&key=fresh"), want: http.StatusOK, run: true, store: "memory"},
		{name: "redis slow, short ttl", method: http.MethodGet, route: "/charge-idempotent", target: fixed("/charge-idempotent?store=redis&fault=slow&work_ms=300&ttl_ms=100&key=fresh"), want: http.StatusOK, run: true, store: "redis"},
		{name: "postgres crash", method: http.MethodGet, route: "/charge-idempotent", target: fixed("/charge-idempotent?store=postgres&fault=crash_after_charge&attempts=5&key=fresh"), want: http.StatusOK, run: true, store: "postgres"},
		{name: "stepped race", method: http.MethodPost, route: "/lab/step", target: fixed("/lab/step?schedule=look-first-both-look"), want: http.StatusCreated, stepCharges: 2, store: "look-first"},
		{name: "lab check postgres", method: http.MethodGet, route: "/lab/check", target: fixed("/lab/check?store=postgres"), want: http.StatusOK, passes: true, store: "postgres"},
		{name: "page", method: http.MethodGet, route: "/ (html)", target: fixed("/"), headers: accept("text/html"), want: http.StatusOK},
		{name: "page JSON", method: http.MethodGet, route: "/ (json)", target: fixed("/"), headers: accept("application/json"), want: http.StatusOK},
		{name: "outbox", method: http.MethodGet, route: "/outbox", target: fixed("/outbox"), want: http.StatusOK},
		{name: "summary", method: http.MethodGet, route: "/diagnostics/summary", target: fixed("/diagnostics/summary"), want: http.StatusOK},
	}
	return slices.DeleteFunc(steps, func(s pathStep) bool { return s.store != "" && !available(s.store) })
}

func accept(mime string) func(*attendee, int) http.Header {
	return func(*attendee, int) http.Header { return http.Header{"Accept": {mime}} }
}

// matrixStep is the breakage matrix, fetched as the page's JSON.
var matrixStep = pathStep{name: "matrix", method: http.MethodGet, route: "/lab/matrix", target: fixed("/lab/matrix?format=json"), want: http.StatusOK}

// workshop is one load under way.
type workshop struct {
	cfg    WorkshopConfig
	client *http.Client
	path   []pathStep

	mu       sync.Mutex
	steps    map[string]*StepStats
	routes   map[string]*StepStats
	all      []float64
	requests int
	errors   int
	active   int
	res      *WorkshopResult
}

// RunWorkshop runs the workshop load the config describes and checks it.
// err is for what kept it from running; what the checks found is in the
// result (Failures).
func RunWorkshop(ctx context.Context, cfg WorkshopConfig) (*WorkshopResult, error) {
	if cfg.Attendees < 1 || cfg.Rounds < 0 || cfg.Rounds == 0 && cfg.Duration <= 0 || cfg.Think < 0 {
		return nil, errors.New("workshop: at least one attendee, and a number of rounds or a duration, are required")
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Attendees + 8}, Timeout: 10 * time.Minute}
	defer client.CloseIdleConnections()
	stores, _, err := discover(ctx, client, cfg.URL)
	if err != nil {
		return nil, err
	}
	w := &workshop{cfg: cfg, client: client, steps: map[string]*StepStats{}, routes: map[string]*StepStats{}, res: &WorkshopResult{
		Command: cfg.Command, Started: time.Now().UTC(), Attendees: cfg.Attendees, Rounds: cfg.Rounds, Seed: cfg.Seed,
		ThinkMS: msOf(cfg.Think), Host: hostNow(), Alone: map[string]lab.Verdict{}, PGOpen: -1, PGActive: -1,
	}}
	if cfg.Rounds == 0 {
		w.res.Duration = cfg.Duration
	}
	w.path = workshopPath(func(name lab.StoreName) bool {
		return slices.ContainsFunc(stores, func(s storeInfo) bool { return s.Name == name && s.Available })
	})
	if cfg.Planned != nil {
		cfg.Planned(WorkshopPlan{Attendees: cfg.Attendees, Rounds: cfg.Rounds, Duration: cfg.Duration, Steps: len(w.path), Think: cfg.Think, Matrices: cfg.Matrices})
	}

	// Alone first: one attendee walks the path with nobody else, and the
	// matrix runs once, so that the load has something to be held to.
	solo, err := w.join(ctx, -1)
	if err != nil {
		return nil, err
	}
	for _, s := range w.path {
		ans, err := w.do(ctx, solo, 0, s, false)
		if err != nil {
			return nil, fmt.Errorf("workshop: %s alone: %w", s.name, err)
		}
		if s.run {
			w.res.Alone[s.name] = ans.verdict
		}
	}
	if cfg.Matrices > 0 {
		began := time.Now()
		if _, err := w.do(ctx, solo, 0, matrixStep, false); err != nil {
			return nil, fmt.Errorf("workshop: the matrix alone: %w", err)
		}
		w.res.MatrixAloneMS = msOf(time.Since(began))
	}
	before, err := w.scrape(ctx)
	if err != nil {
		return nil, err
	}
	w.res.Process.RSSBeforeBytes, w.res.Process.RSSMaxBytes, w.res.Process.IncludesLoadGen = before.rss, before.rss, cfg.InProcess

	began := time.Now()
	deadline := began.Add(cfg.Duration)
	lctx, stop := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		w.sample(lctx, began)
	}()
	var wg sync.WaitGroup
	waitMS := make([]float64, cfg.Attendees)
	for i := range cfg.Attendees {
		wg.Go(func() {
			waitMS[i] = w.attend(ctx, i, deadline)
		})
	}
	wg.Wait()
	stop()
	<-sampled
	w.progress(began) // the last line, however short the load
	w.res.Elapsed = time.Since(began)
	after, err := w.scrape(ctx)
	if err != nil {
		return nil, err
	}
	p := &w.res.Process
	p.CPUSeconds = after.cpu - before.cpu
	p.CPUPerAttendee = p.CPUSeconds / float64(cfg.Attendees)
	p.CPUUtilisation = p.CPUSeconds / w.res.Elapsed.Seconds()
	p.RSSMaxBytes = max(p.RSSMaxBytes, after.rss)
	p.RSSPerAttendee = max(0, p.RSSMaxBytes-p.RSSBeforeBytes) / float64(cfg.Attendees)
	w.res.WaitMS = slices.DeleteFunc(waitMS, func(ms float64) bool { return ms <= 0 }) // those that could not join
	if m := median(w.res.WaitMS); m > 0 {
		w.res.Fairness = slices.Max(w.res.WaitMS) / m
	}
	w.conclude()
	return w.res, nil
}

// attend is attendee i's workshop: arrive, join, walk the path; it returns
// the time spent waiting on the lab, its matrix excluded (0 when it could
// not join).
func (w *workshop) attend(ctx context.Context, i int, deadline time.Time) float64 {
	w.count(func() { w.active++ })
	defer w.count(func() { w.active-- })
	rng := rand.New(rand.NewPCG(w.cfg.Seed, uint64(i)))
	if !sleep(ctx, time.Duration(rng.Float64()*float64(w.cfg.Think))) {
		return 0
	}
	began := time.Now()
	a, err := w.join(ctx, i)
	if err != nil {
		w.wrong("attendee %d: %v", i, err)
		return 0
	}
	a.rng = rng
	waited := time.Since(began)
	for round := 0; w.cfg.Rounds > 0 && round < w.cfg.Rounds || w.cfg.Rounds == 0 && (round == 0 || time.Now().Before(deadline)); round++ {
		for _, s := range w.path {
			if !sleep(ctx, w.think(rng)) {
				return msOf(waited)
			}
			began := time.Now()
			_, _ = w.do(ctx, a, round, s, true)
			waited += time.Since(began)
		}
		if round == 0 && i < w.cfg.Matrices {
			began := time.Now()
			if _, err := w.do(ctx, a, round, matrixStep, true); err == nil {
				w.count(func() { w.res.MatrixLoadedMS = append(w.res.MatrixLoadedMS, msOf(time.Since(began))) })
			}
		}
	}
	return msOf(waited)
}

func (w *workshop) think(rng *rand.Rand) time.Duration {
	return time.Duration((0.5 + rng.Float64()) * float64(w.cfg.Think))
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (w *workshop) count(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f()
}

func (w *workshop) wrong(format string, args ...any) {
	w.count(func() { w.res.Wrong = append(w.res.Wrong, fmt.Sprintf(format, args...)) })
}

// join asks the lab for an attendee's namespace.
func (w *workshop) join(ctx context.Context, n int) (*attendee, error) {
	var body io.Reader // no code: no body, as the README's curl
	if w.cfg.JoinCode != "" {
		code, _ := json.Marshal(map[string]string{"code": w.cfg.JoinCode})
		body = bytes.NewReader(code)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.URL+"/lab/join", body)
	if err != nil {
		return nil, fmt.Errorf("error building the join: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("error joining: %w", err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("error reading the join's answer: %w", err)
	}
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("POST /lab/join answered %d: %s", resp.StatusCode, answer)
	}
	a := &attendee{n: n}
	if err := json.Unmarshal(answer, a); err != nil {
		return nil, fmt.Errorf("error decoding the join's answer: %w", err)
	}
	return a, nil
}

// answer is what the checks read of one step's answer.
type answer struct {
	status  int
	verdict lab.Verdict
}

// maxRetries bounds how often an attendee waits out a refusal before it
// gives the step up.
const maxRetries = 20

// do takes one step as attendee a: refusals with Retry-After are waited
// out and retried; the answer is checked against what the step expects.
// recorded says whether it counts in the figures.
func (w *workshop) do(ctx context.Context, a *attendee, round int, s pathStep, recorded bool) (answer, error) {
	for try := 0; ; try++ {
		status, h, body, took, err := w.send(ctx, a, round, s)
		if err != nil {
			if recorded {
				w.record(s, 0, took, false)
				w.wrong("attendee %d, %s: %v", a.n, s.name, err)
			}
			return answer{}, err
		}
		refused := status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
		announced := refused && h.Get("Retry-After") != "" // shed: the lab says when to come back
		if announced && try == maxRetries && a.n >= 0 {
			// Refused every time, as announced: the attendee gives the
			// step up, as a person would, and goes on.
			if recorded {
				w.record(s, status, took, true)
				w.count(func() { w.res.GaveUp++ })
			}
			return answer{status: status}, nil
		}
		if announced && try < maxRetries {
			if recorded {
				w.record(s, status, took, true)
			}
			secs, _ := strconv.Atoi(h.Get("Retry-After"))
			// Jittered, as a client should, so that the refused do not
			// come back together.
			wait := time.Duration((0.5 + a.randFloat()) * float64(time.Duration(max(secs, 1))*time.Second))
			if !sleep(ctx, wait) {
				return answer{}, ctx.Err()
			}
			continue
		}
		ans, err := w.check(a, s, status, h, body)
		if recorded {
			w.record(s, status, took, false)
			w.count(func() {
				switch {
				case status >= 500: // without Retry-After, a 503 is an error
					w.res.FiveXX++
				case refused:
					w.res.Unannounced++
				}
			})
			if err != nil {
				w.wrong("attendee %d, round %d, %s: %v", a.n, round, s.name, err)
			}
		}
		return ans, err
	}
}

func (a *attendee) randFloat() float64 {
	if a.rng == nil {
		return 0.5
	}
	return a.rng.Float64()
}

func (w *workshop) send(ctx context.Context, a *attendee, round int, s pathStep) (int, http.Header, []byte, time.Duration, error) {
	var body io.Reader
	if s.body != "" {
		body = strings.NewReader(s.body)
	}
	req, err := http.NewRequestWithContext(ctx, s.method, w.cfg.URL+s.target(a, round), body)
	if err != nil {
		return 0, nil, nil, 0, fmt.Errorf("error building the request: %w", err)
	}
	if s.headers != nil {
		req.Header = s.headers(a, round)
	}
	req.Header.Set("Authorization", "Bearer "+a.Token)
	began := time.Now()
	resp, err := w.client.Do(req)
	if err != nil {
		return 0, nil, nil, time.Since(began), fmt.Errorf("error sending %s %s: %w", s.method, s.route, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	took := time.Since(began)
	if err != nil {
		return 0, nil, nil, took, fmt.Errorf("error reading the answer of %s: %w", s.route, err)
	}
	return resp.StatusCode, resp.Header, answer, took, nil
}

// check holds one answer to what the step expects: its status, the replay
// header, a run's verdict against the same run alone, and every ledger row
// of the run the attendee's own.
func (w *workshop) check(a *attendee, s pathStep, status int, h http.Header, body []byte) (answer, error) {
	ans := answer{status: status}
	if status != s.want {
		return ans, fmt.Errorf("answered %d, not %d: %.300s", status, s.want, body)
	}
	if s.replay && h.Get("Idempotent-Replayed") != "true" {
		return ans, errors.New("the retried charge was not answered as a replay (Idempotent-Replayed)")
	}
	if s.stepCharges > 0 {
		var run struct {
			Ledger struct{ Charges int } `json:"ledger"`
		}
		if err := json.Unmarshal(body, &run); err != nil {
			return ans, fmt.Errorf("error decoding the stepped run: %w", err)
		}
		if run.Ledger.Charges != s.stepCharges {
			return ans, fmt.Errorf("the stepped run's ledger holds %d charges, not %d", run.Ledger.Charges, s.stepCharges)
		}
	}
	if s.passes {
		var rep struct {
			Failed []string `json:"failed"`
		}
		if err := json.Unmarshal(body, &rep); err != nil {
			return ans, fmt.Errorf("error decoding the check's report: %w", err)
		}
		if len(rep.Failed) > 0 {
			return ans, fmt.Errorf("the check failed %s", strings.Join(rep.Failed, ", "))
		}
	}
	if !s.run {
		return ans, nil
	}
	var rep struct {
		Verdict    lab.Verdict   `json:"verdict"`
		Namespace  lab.Namespace `json:"namespace"`
		LedgerRows []lab.Payment `json:"ledger_rows"`
	}
	if err := json.Unmarshal(body, &rep); err != nil {
		return ans, fmt.Errorf("error decoding the run's report: %w", err)
	}
	ans.verdict = rep.Verdict
	if rep.Namespace != a.Namespace {
		return ans, fmt.Errorf("the run was of namespace %s, not the attendee's %s", rep.Namespace, a.Namespace)
	}
	for _, p := range rep.LedgerRows {
		if p.Tenant != a.Tenant && p.Tenant != a.SecondTenant {
			return ans, fmt.Errorf("the run's ledger holds charge %s of tenant %s, not the attendee's %s", p.ChargeID, p.Tenant, a.Tenant)
		}
	}
	if alone, ok := w.res.Alone[s.name]; ok && a.n >= 0 && rep.Verdict != alone {
		return ans, fmt.Errorf("verdict %s, alone %s", rep.Verdict, alone)
	}
	return ans, nil
}

// record counts one answer (or refusal) of a step and its route; status 0
// is a request that got no answer.
func (w *workshop) record(s pathStep, status int, took time.Duration, shed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ms, failed, label := msOf(took), status == 0 || status >= 500, strconv.Itoa(status)
	switch {
	case status == 0:
		label = "no answer"
	case shed:
		label = "shed " + label // not an error, whatever its status
	}
	for _, st := range []*StepStats{w.stats(w.steps, s.name), w.stats(w.routes, s.method+" "+s.route)} {
		st.Statuses[label]++
		if shed {
			st.Shed++
			continue
		}
		st.Count++
		st.ms = append(st.ms, ms)
		if failed {
			st.Errors++
		}
	}
	if shed {
		w.res.Shed++
		return
	}
	w.requests++
	w.all = append(w.all, ms)
	if failed {
		w.errors++
	}
}

func (w *workshop) stats(m map[string]*StepStats, name string) *StepStats {
	st, ok := m[name]
	if !ok {
		st = &StepStats{Name: name, Statuses: map[string]int{}}
		m[name] = st
	}
	return st
}

// conclude sets the percentiles and orders the steps as the path does.
func (w *workshop) conclude() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range append(slices.Clone(w.path), matrixStep) {
		if st, ok := w.steps[s.name]; ok {
			w.res.Steps = append(w.res.Steps, st)
		}
	}
	for _, st := range w.routes {
		w.res.Routes = append(w.res.Routes, st)
	}
	slices.SortFunc(w.res.Routes, func(x, y *StepStats) int { return strings.Compare(x.Name, y.Name) })
	for _, st := range append(slices.Clone(w.res.Steps), w.res.Routes...) {
		st.P50MS, st.P95MS, st.P99MS = percentile(st.ms, 50), percentile(st.ms, 95), percentile(st.ms, 99)
		if len(st.ms) > 0 {
			st.MaxMS = slices.Max(st.ms)
		}
	}
}

// percentile p of xs (nearest rank), 0 for none.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	rank := int(p/100*float64(len(s))+0.999999) - 1
	return s[min(max(rank, 0), len(s)-1)]
}

// sample reports progress and samples the process and PostgreSQL every
// few seconds until ctx ends.
func (w *workshop) sample(ctx context.Context, began time.Time) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if p, err := w.scrape(ctx); err == nil {
			w.count(func() { w.res.Process.RSSMaxBytes = max(w.res.Process.RSSMaxBytes, p.rss) })
		}
		if w.cfg.Connections != nil {
			if open, active, err := w.cfg.Connections(ctx); err == nil {
				w.count(func() { w.res.PGOpen, w.res.PGActive = max(w.res.PGOpen, open), max(w.res.PGActive, active) })
			}
		}
		if n++; n%2 == 0 {
			w.progress(began)
		}
	}
}

// progress reports the load so far, if the config asks.
func (w *workshop) progress(began time.Time) {
	if w.cfg.Progress == nil {
		return
	}
	w.mu.Lock()
	pr := WorkshopProgress{Elapsed: time.Since(began), Active: w.active, Requests: w.requests, Errors: w.errors, Shed: w.res.Shed, P99MS: percentile(w.all, 99)}
	w.mu.Unlock()
	w.cfg.Progress(pr)
}

// processSample is what /metrics says of the lab's process.
type processSample struct{ cpu, rss float64 }

func (w *workshop) scrape(ctx context.Context) (processSample, error) {
	var p processSample
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.cfg.URL+"/metrics", nil)
	if err != nil {
		return p, fmt.Errorf("error building the metrics request: %w", err)
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return p, fmt.Errorf("error reading the lab's metrics: %w", err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return p, fmt.Errorf("error reading the lab's metrics (%d): %w", resp.StatusCode, err)
	}
	for line := range strings.Lines(string(text)) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		x, _ := strconv.ParseFloat(value, 64)
		switch name {
		case "process_cpu_seconds_total":
			p.cpu = x
		case "process_resident_memory_bytes":
			p.rss = x
		}
	}
	return p, nil
}
