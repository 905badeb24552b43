// Package bench measures a running lab's charge path under real HTTP load
// (vegeta, a fixed number of connections, as fast as they go), checks every
// loaded phase against the ledger, and sets each figure beside a ceiling
// measured in the same run: pgbench on the postgres store's own statements,
// redis-benchmark on the redis store's replay command, a bare Echo handler
// for HTTP itself, and the serial bound of HTTP and the store together. It
// can run it all in rounds and report medians and spreads, and then holds
// each keyed store's fresh charges at fixed rates with the outbox relay
// running, sampling the outbox's lag. `lab bench` (cmd/lab) starts the lab
// and prints the result.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Ledger is what the bench reads of the ledger: the charges a run made,
// listed and counted, the charges under one key, and the outbox.
type Ledger interface {
	// OpenRun registers a phase's run in the bench's namespace, as every run
	// is before its charges carry it.
	OpenRun(ctx context.Context, ns lab.Namespace, run string) error
	RunStats(ctx context.Context, ns lab.Namespace, run string) (lab.RunStats, error)
	KeyCharges(ctx context.Context, tenant string, store lab.StoreName, key string) (lab.KeyTally, error)
	Payments(ctx context.Context, ns lab.Namespace, run string, limit int) ([]lab.Payment, error)
	OutboxStats(ctx context.Context, ns lab.Namespace) (lab.OutboxStats, error)
	OutboxBacklog(ctx context.Context, ns lab.Namespace) (lab.OutboxBacklog, error)
}

// Lab is the running lab under load.
type Lab struct {
	URL       string        // the primary replica's base URL
	Token     string        // bearer token the load charges with ("" sends none)
	Tenant    string        // the tenant of that token
	Namespace lab.Namespace // the tenant's namespace
	// Targets returns n replicas' base URLs (the primary first), starting
	// in-process replicas as needed.
	Targets func(ctx context.Context, n int) ([]string, error)
	Books   Ledger
	// QueuedWebhooks, when set, says how many webhook jobs the provider has
	// still to send: the lab answers each, so a phase waits for them too.
	QueuedWebhooks func(ctx context.Context) (int64, error)
	// DropConnections, when set, closes the lab's idle PostgreSQL
	// connections once a phase has settled (see Config.Connections).
	DropConnections func()
	// HoldDelivery, when set, stops (true) and resumes (false) the lab's
	// outbox relay: a fresh phase measures the charge path alone, as
	// pgbench does its statements, and the relay's drain is timed after.
	HoldDelivery func(held bool)
	// Webhooks, when set, counts the provider's webhooks of one run of the
	// namespace: a sustained step counts an event settled once they are
	// acknowledged. A run's own, so that the count costs what the step
	// made, not every webhook the provider keeps.
	Webhooks func(ctx context.Context, run string) (WebhookCounts, error)
}

// Config says what to measure.
type Config struct {
	Lab         Lab
	ID          string        // names the bench's runs and keys; "" draws one
	Duration    time.Duration // of each loaded phase
	Connections int           // concurrent requests, each on its own kept-alive connection
	Stores      []lab.StoreName
	Replicas    []int // replica counts each store is loaded on, e.g. 1 and 3
	Echo        bool  // measure the bare Echo handler (the HTTP ceiling)
	External    bool  // measure pgbench and redis-benchmark when installed
	DatabaseURL string
	RedisURL    string
	RedisPrefix string // keys redis-benchmark reads live under it, deleted after
	AttemptRuns int    // 64-attempt lab runs per store, in each round
	// Repeat is how many rounds the bench runs: every phase, ceiling and
	// 64-attempt run once per round, the rounds one after the other, so
	// that a drift of the machine's speed meets every path alike; the
	// table reports each figure's median and spread. 0 means 1.
	Repeat int
	// Sustained are the rates of each keyed store's sustained phase, as
	// fractions of its fresh (Accounts accounts) throughput in the same
	// bench, in the order run; none: no sustained phase.
	Sustained []float64
	// SustainedSearch is how many more steps each keyed store's sustained
	// phase takes after the fractions, searching between the highest rate
	// that held and the lowest that did not (from the relay's drain rate
	// when none did) for the rate the relay keeps up with; 0: no search.
	SustainedSearch int
	Command         string // the command line that reproduces the run, for the report
	Progress        func(done, total int, label string)
}

// Kind is a loaded path.
type Kind string

// The loaded paths.
const (
	FreshHot  Kind = "fresh_hot"  // a new key per request, one account
	FreshMany Kind = "fresh_many" // a new key per request, one of Accounts accounts
	Replay    Kind = "replay"     // one completed key, repeated
)

// Accounts is how many accounts the many-accounts phase spreads over.
const Accounts = 1000

// Attempts is the size of the concurrent lab runs.
const Attempts = 64

// Result is every figure of one bench.
type Result struct {
	ID          string          `json:"id"`
	Command     string          `json:"command,omitempty"`
	Started     time.Time       `json:"started"`
	Elapsed     time.Duration   `json:"elapsed_ns"`
	Duration    time.Duration   `json:"phase_duration_ns"`
	Connections int             `json:"connections"`
	Replicas    []int           `json:"replicas"`
	Stores      []lab.StoreName `json:"stores"`
	Repeat      int             `json:"repeat"` // rounds: each phase and ceiling ran this many times
	Host        Host            `json:"host"`
	Phases      []*Phase        `json:"phases"` // every round's
	Skipped     []Skip          `json:"skipped,omitempty"`
	Ceilings    []*Ceiling      `json:"ceilings"` // every round's
	Concurrent  []*Concurrent   `json:"concurrent_runs"`
	// Paths and CeilingSummaries are the medians and spreads over the
	// rounds: what the table shows.
	Paths            []*PathSummary    `json:"paths"`
	CeilingSummaries []*CeilingSummary `json:"ceiling_summaries"`
	// Sustained are the keyed stores' sustained phases, after the rounds.
	Sustained []*Sustained `json:"sustained,omitempty"`
}

// Host is where the bench ran.
type Host struct {
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Go         string `json:"go"`
	OS         string `json:"os"`
}

func hostNow() Host {
	return Host{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
}

// Skip is a store or a path not measured, and why.
type Skip struct {
	Store  lab.StoreName `json:"store"`
	Kind   Kind          `json:"kind,omitempty"` // empty: every path of the store
	Reason string        `json:"reason"`
}

// Concurrent is a store's 64-attempt lab runs. A run's wall time is its
// attempts alone, from their release to the last answer, without the
// checks that follow.
type Concurrent struct {
	Store          lab.StoreName `json:"store"`
	Runs           int           `json:"runs"`
	WallMS         []float64     `json:"wall_ms"`
	SpreadMS       []float64     `json:"barrier_spread_ms"`
	MedianWallMS   float64       `json:"median_wall_ms"`
	MedianSpreadMS float64       `json:"median_barrier_spread_ms"`
	Wall           Spread        `json:"wall_ms_spread"`
	// GoalWallMS is the target for the median wall time, when it
	// sets one for the store.
	GoalWallMS float64        `json:"goal_wall_ms,omitempty"`
	Verdicts   map[string]int `json:"verdicts"`
	Error      string         `json:"error,omitempty"`
}

// wallGoalMS is the target for a store's median 64-attempt wall
// time, 0 for none.
func wallGoalMS(store lab.StoreName) float64 {
	switch store {
	case "memory":
		return 10
	case "postgres":
		return 20
	}
	return 0
}

// Failures lists what failed: ledger checks, phases that could not run,
// concurrent runs that errored. Empty when the bench holds.
func (r *Result) Failures() []string {
	var out []string
	for _, p := range r.Phases {
		if p.Error != "" {
			out = append(out, p.name(r.Repeat)+": "+p.Error)
		}
		if p.Check != nil && !p.Check.OK {
			out = append(out, p.name(r.Repeat)+": ledger check failed: "+strings.Join(p.Check.Failures, "; "))
		}
	}
	for _, c := range r.Concurrent {
		if c.Error != "" {
			out = append(out, fmt.Sprintf("%d concurrent attempts on %s: %s", Attempts, c.Store, c.Error))
		}
	}
	for _, s := range r.Sustained {
		for _, x := range s.Steps {
			name := fmt.Sprintf("sustained %s at %s", s.Store, percent(x.Fraction))
			if x.Error != "" {
				out = append(out, name+": "+x.Error)
			}
			if x.Check != nil && !x.Check.OK {
				out = append(out, name+": ledger check failed: "+strings.Join(x.Check.Failures, "; "))
			}
		}
	}
	return out
}

// WriteJSON writes every figure.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("error writing the bench as JSON: %w", err)
	}
	return nil
}

// storeInfo is a registered store, as the lab's index lists it.
type storeInfo struct {
	Name        lab.StoreName `json:"name"`
	RequiresKey bool          `json:"requires_key"`
	Available   bool          `json:"available"`
	HowToEnable string        `json:"how_to_enable"`
}

// discover reads the lab's stores and its replica bound from GET /.
func discover(ctx context.Context, client *http.Client, base string) ([]storeInfo, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
	if err != nil {
		return nil, 0, fmt.Errorf("error building the index request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("error reading the lab's index: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("the lab's index answered %d", resp.StatusCode)
	}
	var idx struct {
		Variants    []storeInfo `json:"variants"`
		MaxReplicas int         `json:"max_replicas"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&idx); err != nil {
		return nil, 0, fmt.Errorf("error decoding the lab's index: %w", err)
	}
	return idx.Variants, idx.MaxReplicas, nil
}

// step is one unit of work, counted by the progress bar.
type step struct {
	label string
	run   func(ctx context.Context) error
}

// Run measures the lab as cfg says. A ledger check that fails does not
// stop the bench: it is reported in the result (see Failures); err is for
// what kept the bench from running at all.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Duration <= 0 || cfg.Connections < 1 || len(cfg.Replicas) == 0 || cfg.Lab.Books == nil || cfg.Lab.Targets == nil {
		return nil, errors.New("bench: a positive duration, at least one connection, replica counts, books and targets are required")
	}
	if cfg.ID == "" {
		cfg.ID = NewID()
	}
	if cfg.Progress == nil {
		cfg.Progress = func(int, int, string) {}
	}
	cfg.Repeat = max(cfg.Repeat, 1)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: 2 * time.Minute}
	defer client.CloseIdleConnections()
	all, maxReplicas, err := discover(ctx, client, cfg.Lab.URL)
	if err != nil {
		return nil, err
	}
	stores, err := pick(all, cfg.Stores)
	if err != nil {
		return nil, err
	}
	for _, n := range cfg.Replicas {
		if n < 1 || n > maxReplicas {
			return nil, fmt.Errorf("bench: replicas must be in 1..%d on this lab (got %d)", maxReplicas, n)
		}
	}
	res := &Result{
		ID: cfg.ID, Command: cfg.Command, Started: time.Now().UTC(), Duration: cfg.Duration, Connections: cfg.Connections,
		Replicas: cfg.Replicas, Repeat: cfg.Repeat, Host: hostNow(),
	}
	b := &bencher{cfg: cfg, client: client, res: res}
	for _, st := range stores {
		res.Stores = append(res.Stores, st.Name)
		if !st.Available {
			res.Skipped = append(res.Skipped, Skip{Store: st.Name, Reason: st.HowToEnable})
		} else if !st.RequiresKey {
			res.Skipped = append(res.Skipped, Skip{Store: st.Name, Kind: Replay, Reason: "it ignores the key: every request is charged again, there is nothing to replay"})
		}
	}
	var steps []step
	concurrent := map[lab.StoreName]*Concurrent{}
	for round := 1; round <= cfg.Repeat; round++ {
		steps = append(steps, b.round(round, stores, len(steps), concurrent)...)
	}
	sustained := 0
	next := func() string {
		sustained++
		return fmt.Sprintf("bench-%s-sustained-%d", cfg.ID, sustained)
	}
	for _, st := range stores {
		steps = append(steps, b.sustainedSteps(st, next)...)
	}
	began := time.Now()
	for i, s := range steps {
		cfg.Progress(i, len(steps), s.label)
		if err := s.run(ctx); err != nil {
			return res, err
		}
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("bench interrupted: %w", err)
		}
	}
	cfg.Progress(len(steps), len(steps), "done")
	res.Elapsed = time.Since(began)
	conclude(res)
	return res, nil
}

// round lists one round's steps: store by store, each path on every
// replica count in turn, then the store's ceilings, so what the table sets
// side by side is measured close together; then the 64-attempt runs. Each
// round's phases are numbered on from before, so every run is the bench's
// own.
func (b *bencher) round(round int, stores []storeInfo, before int, concurrent map[lab.StoreName]*Concurrent) []step {
	cfg, res := b.cfg, b.res
	var steps []step
	for _, st := range stores {
		if !st.Available {
			continue
		}
		for _, k := range []Kind{FreshHot, FreshMany, Replay} {
			if k == Replay && !st.RequiresKey {
				continue
			}
			for _, n := range cfg.Replicas {
				p := &Phase{Store: st.Name, Kind: k, Replicas: n, Round: round, Run: fmt.Sprintf("bench-%s-%d", cfg.ID, before+len(steps)+1), keyed: st.RequiresKey}
				steps = append(steps, step{label: p.name(cfg.Repeat), run: func(ctx context.Context) error {
					res.Phases = append(res.Phases, p)
					return b.phase(ctx, p)
				}})
			}
		}
		steps = append(steps, b.ceilingSteps(st.Name, round)...)
	}
	if cfg.Echo && !slices.ContainsFunc(stores, func(s storeInfo) bool { return s.Name == "memory" && s.Available }) {
		steps = append(steps, b.echoStep(round)...) // the HTTP ceiling, with no memory replay beside it
	}
	for _, st := range stores {
		if !st.Available || cfg.AttemptRuns <= 0 {
			continue
		}
		steps = append(steps, step{label: fmt.Sprintf("%d concurrent attempts on %s", Attempts, st.Name) + roundSuffix(round, cfg.Repeat), run: func(ctx context.Context) error {
			if _, _, err := b.settle(ctx); err != nil {
				return err
			}
			c := concurrent[st.Name]
			if c == nil {
				c = &Concurrent{Store: st.Name, Verdicts: map[string]int{}}
				concurrent[st.Name] = c
				res.Concurrent = append(res.Concurrent, c)
			}
			b.concurrent(ctx, st, c)
			return nil
		}})
	}
	return steps
}

// roundSuffix names the round in a label when there are several.
func roundSuffix(round, rounds int) string {
	if rounds <= 1 {
		return ""
	}
	return fmt.Sprintf(" (round %d of %d)", round, rounds)
}

// pick keeps the stores asked for (every registered one when none is), in
// the lab's order, and refuses a name the lab does not know.
func pick(all []storeInfo, want []lab.StoreName) ([]storeInfo, error) {
	if len(want) == 0 {
		return all, nil
	}
	var names []string
	for _, s := range all {
		names = append(names, string(s.Name))
	}
	for _, w := range want {
		if !slices.Contains(names, string(w)) {
			return nil, fmt.Errorf("bench: unknown store %q (the lab has %s)", w, strings.Join(names, ", "))
		}
	}
	var out []storeInfo
	for _, s := range all {
		if slices.Contains(want, s.Name) {
			out = append(out, s)
		}
	}
	return out, nil
}

// NewID returns a short random name for one bench: its runs, keys, scratch
// schema and Redis keys carry it.
func NewID() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// bencher runs the steps of one bench.
type bencher struct {
	cfg    Config
	client *http.Client
	res    *Result
	// replayBody is a replay's answer as the lab sent it, for the bare
	// Echo handler to send the same bytes.
	replayBody []byte
}
