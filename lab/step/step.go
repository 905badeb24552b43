// Package step plays a run's attempts move by move. Each attempt of a
// stepped run is a real POST /charges whose context carries a gate
// (lab.WithStepGate): at every pause point of the store's path it stops
// and waits until it is told to move. The order of those moves, the
// schedule, decides what overlaps — not the scheduler, not a sleep — so a
// schedule gives the same outcome every time it is played.
//
// The registry lives in one process and is shared by its in-process
// replicas: an attempt reaching any of them finds its gate. Peers in
// cluster mode have registries of their own and refuse the header.
package step

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Header carries "<run id>/<attempt>" on a stepped attempt's request.
const Header = "Lab-Step"

// Bounds of a stepped run.
const (
	MinAttempts = 2
	MaxAttempts = 8
)

// State is where one attempt stands.
type State string

const (
	StateReady    State = "ready"    // not sent yet: its first advance sends it
	StateMoving   State = "moving"   // released, not yet at its next point or answer
	StatePaused   State = "paused"   // waiting at a pause point for its turn
	StateBlocked  State = "blocked"  // neither reached a point nor answered within the settle time: waiting in the store
	StateAnswered State = "answered" // the API answered it (or its request failed)
)

// Errors of the stepper, mapped to problems by the API.
var (
	ErrNotFound = errors.New("no stepped run of this namespace has that id")
	ErrRunning  = errors.New("this namespace already has a stepped run in progress: finish it, or wait for it to be aborted when idle")
	ErrAborted  = errors.New("the stepped run was aborted")
	ErrFinished = errors.New("the stepped run is over: every attempt answered")
)

// Answer is what the API answered one attempt.
type Answer struct {
	Status   int    `json:"status"`
	ChargeID string `json:"charge_id,omitempty"`
	Replayed bool   `json:"replayed"`
	Replica  string `json:"replica,omitempty"`
	Error    string `json:"error,omitempty"` // the request itself failed (aborted, connection dropped)
}

// Sender sends attempt n (1-based) as a real request under the
// Idempotency-Key key, carrying header in Header, and returns what the API
// answered. ctx ends when the run is aborted.
type Sender func(ctx context.Context, n int, key, header string) Answer

// The stepper's bounds as the lab runs it.
const (
	// DefaultSettle is long enough for a released attempt to reach its
	// next point on a loaded machine (300 ms was not, under the race
	// detector beside other test runs), and well within the in-flight
	// wait (2 s) that bounds an attempt blocked on a twin in the store.
	DefaultSettle = time.Second
	// DefaultIdle aborts a stepped run nobody advances.
	DefaultIdle = 2 * time.Minute
)

// Config bounds the stepper's waits; both are required.
type Config struct {
	// Settle is how long an advance waits for the attempt to reach its
	// next point or its answer before calling it blocked in the store.
	Settle time.Duration
	// Idle is how long a stepped run may wait for its next advance before
	// it is aborted and its requests cancelled (the store rolls back what
	// it would roll back for a client that left).
	Idle time.Duration
}

// Registry holds the process's stepped runs: at most one in progress per
// namespace, and the last one of each namespace once it is over.
type Registry struct {
	cfg Config

	mu     sync.Mutex
	byNS   map[lab.Namespace]*Run // the namespace's newest run, in progress or over
	closed bool
}

// NewRegistry returns an empty registry.
func NewRegistry(cfg Config) (*Registry, error) {
	if cfg.Settle <= 0 || cfg.Idle <= 0 {
		return nil, fmt.Errorf("step: settle and idle must be positive (got %s, %s)", cfg.Settle, cfg.Idle)
	}
	return &Registry{cfg: cfg, byNS: map[lab.Namespace]*Run{}}, nil
}

// Spec is what a stepped run charges, and where.
type Spec struct {
	Namespace lab.Namespace
	Store     lab.StoreName
	Key       string // the Idempotency-Key every attempt sends; "" for the run's id
	Attempts  int
	Replicas  []string // the replica each attempt reaches, by attempt
	Schedule  string   // the named schedule it plays, "" for none
}

// Start opens a stepped run; nothing is sent until an advance.
func (g *Registry) Start(spec Spec, send Sender) (*Run, error) {
	if spec.Attempts < MinAttempts || spec.Attempts > MaxAttempts {
		return nil, lab.Invalid("attempts", "must be in %d..%d for a stepped run (got %d)", MinAttempts, MaxAttempts, spec.Attempts)
	}
	if len(spec.Replicas) != spec.Attempts {
		return nil, fmt.Errorf("step: %d attempts need as many replicas, got %d", spec.Attempts, len(spec.Replicas))
	}
	id, err := newID()
	if err != nil {
		return nil, err
	}
	if spec.Key == "" {
		spec.Key = id // a key of its own: no earlier run's answer is replayed
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, ErrAborted
	}
	if old := g.byNS[spec.Namespace]; old != nil && old.live() {
		return nil, ErrRunning
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Run{reg: g, id: id, spec: spec, send: send, ctx: ctx, cancel: cancel}
	for n := 1; n <= spec.Attempts; n++ {
		r.attempts = append(r.attempts, &attempt{n: n, state: StateReady, moved: make(chan struct{})})
	}
	r.idle = time.AfterFunc(g.cfg.Idle, func() { r.abort(fmt.Sprintf("idle for %s", g.cfg.Idle)) })
	g.byNS[spec.Namespace] = r
	return r, nil
}

// Find is a namespace's stepped run by id.
func (g *Registry) Find(ns lab.Namespace, id string) (*Run, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if r := g.byNS[ns]; r != nil && r.id == id {
		return r, nil
	}
	return nil, ErrNotFound
}

// Gate resolves a request's Header value for a caller of ns: the gate of an
// attempt the stepper has sent and no request has claimed yet.
func (g *Registry) Gate(ns lab.Namespace, header string) (lab.StepGate, error) {
	id, nstr, ok := strings.Cut(header, "/")
	n, err := strconv.Atoi(nstr)
	if !ok || err != nil {
		return nil, lab.Invalid(Header, "must be <stepped run id>/<attempt> (got %q)", header)
	}
	r, err := g.Find(ns, id)
	if err != nil {
		return nil, lab.Invalid(Header, "names no stepped run of your namespace (POST /lab/step starts one)")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n < 1 || n > len(r.attempts) {
		return nil, lab.Invalid(Header, "attempt must be in 1..%d (got %d)", len(r.attempts), n)
	}
	a := r.attempts[n-1]
	if a.state == StateReady || a.gated || r.aborted != "" {
		return nil, lab.Invalid(Header, "attempt %d of stepped run %s is not the stepper's request in flight", n, id)
	}
	a.gated = true
	return gate{r, a}, nil
}

// Close aborts every run in progress; the registry starts no more.
func (g *Registry) Close() {
	g.mu.Lock()
	g.closed = true
	runs := make([]*Run, 0, len(g.byNS))
	for _, r := range g.byNS {
		runs = append(runs, r)
	}
	g.mu.Unlock()
	for _, r := range runs {
		r.abort("the lab is closing")
		r.wait()
	}
}

func newID() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("error drawing a stepped run id: %w", err)
	}
	return "step-" + hex.EncodeToString(b[:]), nil
}

// Run is one stepped run.
type Run struct {
	reg    *Registry
	id     string
	spec   Spec
	send   Sender
	ctx    context.Context // ends when the run is aborted or over
	cancel context.CancelFunc
	idle   *time.Timer
	sent   sync.WaitGroup // the attempts' requests

	advancing sync.Mutex // one advance at a time

	mu       sync.Mutex
	attempts []*attempt
	steps    []int  // the attempts advanced, in order: the schedule played so far
	aborted  string // why, once aborted
}

// attempt is one attempt's standing, guarded by its run's mu.
type attempt struct {
	n      int
	state  State
	point  lab.PausePoint   // where it is paused
	passed []lab.PausePoint // every point it reached, in order
	answer *Answer
	gated  bool          // a request took its gate
	turn   chan struct{} // closed to let it go on from its point
	moved  chan struct{} // closed and replaced at each change of state
}

// setLocked changes a's state and wakes whoever waits for it to move.
func (a *attempt) setLocked(s State) {
	a.state = s
	close(a.moved)
	a.moved = make(chan struct{})
}

// ID is the run's id.
func (r *Run) ID() string { return r.id }

// Spec is what the run charges, and where.
func (r *Run) Spec() Spec { return r.spec }

func (r *Run) live() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.aborted == "" && !r.overLocked()
}

func (r *Run) overLocked() bool {
	for _, a := range r.attempts {
		if a.state != StateAnswered {
			return false
		}
	}
	return true
}

// Advance moves attempt n (1-based) one move: a ready attempt is sent, a
// paused one released, and the advance returns once it reaches its next
// point, answers, or is found blocked after the settle time. When it
// answered, attempts blocked in the store are given the settle time to
// move too, since its end may have released them.
func (r *Run) Advance(ctx context.Context, n int) error {
	r.advancing.Lock()
	defer r.advancing.Unlock()
	r.mu.Lock()
	switch {
	case r.aborted != "":
		r.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrAborted, r.aborted)
	case r.overLocked():
		r.mu.Unlock()
		return ErrFinished
	case n < 1 || n > len(r.attempts):
		r.mu.Unlock()
		return lab.Invalid("attempt", "must be in 1..%d (got %d)", len(r.attempts), n)
	}
	a := r.attempts[n-1]
	switch a.state {
	case StateAnswered:
		r.mu.Unlock()
		return lab.Invalid("attempt", "attempt %d has already answered", n)
	case StateReady:
		a.setLocked(StateMoving)
		r.sent.Add(1)
		go r.run(a)
	case StatePaused:
		close(a.turn)
		a.turn, a.point = nil, ""
		a.setLocked(StateMoving)
	}
	// Moving or blocked: wait for it to move on.
	r.steps = append(r.steps, n)
	r.idle.Reset(r.reg.cfg.Idle)
	r.mu.Unlock()

	if err := r.await(ctx, a, StateMoving, StateBlocked); err != nil {
		return err
	}
	r.mu.Lock()
	answered := a.state == StateAnswered
	r.mu.Unlock()
	if answered {
		return r.settleBlocked(ctx)
	}
	return nil
}

// settleBlocked gives every blocked attempt the settle time to move.
func (r *Run) settleBlocked(ctx context.Context) error {
	r.mu.Lock()
	var blocked []*attempt
	for _, o := range r.attempts {
		if o.state == StateBlocked {
			blocked = append(blocked, o)
		}
	}
	r.mu.Unlock()
	for _, o := range blocked {
		if err := r.await(ctx, o, StateBlocked); err != nil {
			return err
		}
	}
	return nil
}

// Play advances the attempts of schedule in order.
func (r *Run) Play(ctx context.Context, schedule []int) error {
	for i, n := range schedule {
		if err := r.Advance(ctx, n); err != nil {
			return fmt.Errorf("error at move %d of the schedule (attempt %d): %w", i+1, n, err)
		}
	}
	return nil
}

// await waits while a stays in one of the states, for at most the settle
// time; an attempt still moving then is blocked.
func (r *Run) await(ctx context.Context, a *attempt, while ...State) error {
	settle := time.NewTimer(r.reg.cfg.Settle)
	defer settle.Stop()
	for {
		r.mu.Lock()
		if !slices.Contains(while, a.state) {
			r.mu.Unlock()
			return nil
		}
		moved := a.moved
		r.mu.Unlock()
		select {
		case <-moved:
		case <-settle.C:
			r.mu.Lock()
			if a.state == StateMoving {
				a.setLocked(StateBlocked)
			}
			r.mu.Unlock()
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-r.ctx.Done():
			return nil // aborted or over: the view says which
		}
	}
}

// run sends attempt a and records its answer.
func (r *Run) run(a *attempt) {
	defer r.sent.Done()
	ans := r.send(r.ctx, a.n, r.spec.Key, r.id+"/"+strconv.Itoa(a.n))
	r.mu.Lock()
	a.answer, a.point, a.turn = &ans, "", nil
	a.setLocked(StateAnswered)
	over := r.overLocked()
	r.mu.Unlock()
	if over { // every attempt answered: the run is over
		r.idle.Stop()
		r.cancel()
	}
}

// abort cancels the run's requests; paused attempts give up at their point.
func (r *Run) abort(why string) {
	r.mu.Lock()
	if r.aborted == "" && !r.overLocked() {
		r.aborted = why
	}
	r.mu.Unlock()
	r.idle.Stop()
	r.cancel()
}

// wait returns once every request sent has answered.
func (r *Run) wait() { r.sent.Wait() }

// gate holds one attempt at its points.
type gate struct {
	r *Run
	a *attempt
}

// Reach parks the attempt at p until its next advance.
func (g gate) Reach(ctx context.Context, p lab.PausePoint) error {
	r, a := g.r, g.a
	r.mu.Lock()
	if r.aborted != "" {
		r.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrAborted, r.aborted)
	}
	turn := make(chan struct{})
	a.turn, a.point = turn, p
	a.passed = append(a.passed, p)
	a.setLocked(StatePaused)
	r.mu.Unlock()
	select {
	case <-turn:
		return nil
	case <-ctx.Done():
	case <-r.ctx.Done():
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.aborted != "" { // the run's end cancels its requests too: say why
		return fmt.Errorf("error waiting at %s: %w: %s", p, ErrAborted, r.aborted)
	}
	cause := context.Cause(ctx)
	if cause == nil {
		cause = ErrFinished
	}
	return fmt.Errorf("error waiting at %s: %w", p, cause)
}
