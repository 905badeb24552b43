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
	mrand "math/rand/v2"
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
	// MaxMoves bounds a schedule, and a drawn one: far more than any
	// interleaving of MaxAttempts attempts through every point needs.
	MaxMoves = 64 * MaxAttempts
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
	Code     string `json:"code,omitempty"`  // a problem's code
	Error    string `json:"error,omitempty"` // the request itself failed (aborted, connection dropped)
}

// Sender sends attempt n (1-based) as a real request under the
// Idempotency-Key key, carrying header in Header, and returns what the API
// answered. ctx ends when the run is aborted.
type Sender func(ctx context.Context, n int, key, header string) Answer

// Hooks are what the stepper asks of the lab: to send an attempt, to make
// a time-driven event happen on the store, to read what the store holds
// for the key, and to record the run once it is over.
type Hooks struct {
	Send Sender
	// Happen makes e happen to the run's key on the real store, and says
	// what it did in a few words.
	Happen func(ctx context.Context, e lab.TimeEvent) (string, error)
	// Inspect reads what the store holds for the run's key now.
	Inspect func(ctx context.Context) []lab.KeyInspection
	// Over records the finished run (its history, checked) and says what
	// it found; called once, by the move that ended it.
	Over func(ctx context.Context, v View) Verdict
}

// Verdict is what recording a finished stepped run found.
type Verdict struct {
	RunID      string `json:"run_id"` // the run in the history (GET /lab/runs/{id})
	Checked    string `json:"checked"`
	CheckedWhy string `json:"checked_why"`
}

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
	Planned   []Move   // the named schedule's moves
	Faults    string   // the Lab-Fault its first attempt carries, "" for none
}

// Start opens a stepped run; nothing is sent until an advance.
func (g *Registry) Start(spec Spec, hooks Hooks) (*Run, error) {
	switch {
	case hooks.Send == nil || hooks.Happen == nil || hooks.Inspect == nil || hooks.Over == nil:
		return nil, errors.New("step: every hook is required")
	case spec.Attempts < MinAttempts || spec.Attempts > MaxAttempts:
		return nil, lab.Invalid("attempts", "must be in %d..%d for a stepped run (got %d)", MinAttempts, MaxAttempts, spec.Attempts)
	case len(spec.Replicas) != spec.Attempts:
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
	r := &Run{reg: g, id: id, spec: spec, hooks: hooks, ctx: ctx, cancel: cancel, started: time.Now()}
	for n := 1; n <= spec.Attempts; n++ {
		r.attempts = append(r.attempts, &attempt{n: n, state: StateReady, moved: make(chan struct{}), waitEnds: make(chan struct{})})
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

// Current is the namespace's stepped run in progress, if any.
func (g *Registry) Current(ns lab.Namespace) (*Run, bool) {
	g.mu.Lock()
	r := g.byNS[ns]
	g.mu.Unlock()
	if r == nil || !r.live() {
		return nil, false
	}
	return r, true
}

// Abort ends a run in progress now, as its idle bound would: its requests
// are cancelled and each store rolls back what it holds for them. It
// returns once they have answered.
func (r *Run) Abort(why string) {
	r.abort(why)
	r.wait()
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
	reg     *Registry
	id      string
	spec    Spec
	hooks   Hooks
	ctx     context.Context // ends when the run is aborted or over
	cancel  context.CancelFunc
	idle    *time.Timer
	sent    sync.WaitGroup // the attempts' requests
	started time.Time      // the run's time axis starts here

	advancing sync.Mutex // one move at a time

	mu       sync.Mutex
	attempts []*attempt
	moves    []MoveRecord // every move made, in order, with what followed it
	aborted  string       // why, once aborted
	verdict  *Verdict     // once the finished run is recorded
}

// MoveRecord is one move of a stepped run and where the run stood after it.
type MoveRecord struct {
	Move     Move                `json:"move"`
	AtMS     float64             `json:"at_ms"` // when it was made, on the run's axis
	Did      string              `json:"did"`   // what the move did, in a few words
	Attempts []AttemptStand      `json:"attempts"`
	Store    []lab.KeyInspection `json:"store_state"` // what the store held for the key after it
}

// AttemptStand is where one attempt stood after a move.
type AttemptStand struct {
	Attempt  int            `json:"attempt"`
	State    State          `json:"state"`
	Point    lab.PausePoint `json:"point,omitempty"`
	Blocked  string         `json:"blocked_on,omitempty"`
	Status   int            `json:"status,omitempty"` // once answered
	Replayed bool           `json:"replayed,omitempty"`
	Code     string         `json:"code,omitempty"`
}

// attempt is one attempt's standing, guarded by its run's mu.
type attempt struct {
	n        int
	state    State
	point    lab.PausePoint   // where it is paused
	passed   []lab.PausePoint // every point it reached, in order
	answer   *Answer
	gated    bool          // a request took its gate
	turn     chan struct{} // closed to let it go on from its point
	moved    chan struct{} // closed and replaced at each change of state
	waitEnds chan struct{} // closed and replaced by a "wait" move while it is blocked
	sentAt   time.Time
	answerAt time.Time
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

// Started is when the run opened: its time axis starts there.
func (r *Run) Started() time.Time { return r.started }

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

// Advance makes one move: an attempt's (see move) or an event's (see happen).
// Once the move ends the run, the run is recorded (Hooks.Over).
func (r *Run) Advance(ctx context.Context, m Move) error {
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
	case m.Event == "" && (m.Attempt < 1 || m.Attempt > len(r.attempts)):
		r.mu.Unlock()
		return lab.Invalid("attempt", "must be in 1..%d (got %d)", len(r.attempts), m.Attempt)
	}
	r.idle.Reset(r.reg.cfg.Idle)
	r.mu.Unlock()

	at := time.Since(r.started)
	var did string
	var err error
	if m.Event != "" {
		did, err = r.happen(ctx, m.Event)
	} else {
		did, err = r.move(ctx, r.attempts[m.Attempt-1])
	}
	if err != nil {
		return err
	}
	store := r.hooks.Inspect(ctx)
	r.mu.Lock()
	rec := MoveRecord{Move: m, AtMS: float64(at.Microseconds()) / 1000, Did: did, Store: store}
	for _, av := range r.attemptViewsLocked(store) {
		st := AttemptStand{Attempt: av.Attempt, State: av.State, Point: av.Point, Blocked: av.Blocked}
		if av.Answer != nil {
			st.Status, st.Replayed, st.Code = av.Answer.Status, av.Answer.Replayed, av.Answer.Code
		}
		rec.Attempts = append(rec.Attempts, st)
	}
	r.moves = append(r.moves, rec)
	over, recorded := r.overLocked() && r.aborted == "", r.verdict != nil
	r.mu.Unlock()
	if over && !recorded {
		v := r.hooks.Over(ctx, r.View())
		r.mu.Lock()
		r.verdict = &v
		r.mu.Unlock()
	}
	return nil
}

// move moves attempt a once: a ready attempt is sent, a paused one
// released, and the move ends once it reaches its next point, answers, or
// is found blocked after the settle time. When it answered, attempts
// blocked in the store are given the settle time to move too, since its
// end may have released them.
func (r *Run) move(ctx context.Context, a *attempt) (string, error) {
	r.mu.Lock()
	switch a.state {
	case StateAnswered:
		r.mu.Unlock()
		return "", lab.Invalid("attempt", "attempt %d has already answered", a.n)
	case StateReady:
		a.sentAt = time.Now()
		a.setLocked(StateMoving)
		r.sent.Add(1)
		go r.run(a)
	case StatePaused:
		close(a.turn)
		a.turn, a.point = nil, ""
		a.setLocked(StateMoving)
	}
	// Moving or blocked: wait for it to move on.
	r.mu.Unlock()

	if err := r.await(ctx, a, StateMoving, StateBlocked); err != nil {
		return "", err
	}
	r.mu.Lock()
	answered := a.state == StateAnswered
	r.mu.Unlock()
	if answered {
		if err := r.settleBlocked(ctx); err != nil {
			return "", err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.describeLocked(a), nil
}

// happen makes a time-driven event happen now. "wait" ends the bounded
// waits of the attempts blocked in the store, here and on the store
// itself (a lock wait); every event then gives blocked attempts the
// settle time to move, since it may have released them.
func (r *Run) happen(ctx context.Context, e lab.TimeEvent) (string, error) {
	if e == lab.EventWait {
		r.mu.Lock()
		for _, a := range r.attempts {
			if a.state == StateBlocked || a.state == StateMoving {
				close(a.waitEnds)
				a.waitEnds = make(chan struct{})
			}
		}
		r.mu.Unlock()
	}
	did, err := r.hooks.Happen(ctx, e)
	if err != nil {
		return "", err
	}
	if err := r.settleBlocked(ctx); err != nil {
		return "", err
	}
	return did, nil
}

// describeLocked says where a stands after its move.
func (r *Run) describeLocked(a *attempt) string {
	switch a.state {
	case StatePaused:
		return fmt.Sprintf("attempt %d paused at %s", a.n, a.point)
	case StateAnswered:
		if a.answer.Error != "" {
			return fmt.Sprintf("attempt %d got no answer: %s", a.n, a.answer.Error)
		}
		what := "answered"
		if a.answer.Replayed {
			what = "answered with a replay"
		}
		return fmt.Sprintf("attempt %d %s: %d", a.n, what, a.answer.Status)
	case StateBlocked:
		return fmt.Sprintf("attempt %d is blocked in the store", a.n)
	}
	return fmt.Sprintf("attempt %d is %s", a.n, a.state)
}

// settleBlocked gives every blocked attempt the settle time to move.
func (r *Run) settleBlocked(ctx context.Context) error {
	r.mu.Lock()
	var blocked []*attempt
	for _, o := range r.attempts {
		if o.state == StateBlocked || o.state == StateMoving {
			blocked = append(blocked, o)
		}
	}
	r.mu.Unlock()
	for _, o := range blocked {
		if err := r.await(ctx, o, StateBlocked, StateMoving); err != nil {
			return err
		}
	}
	return nil
}

// Play makes the moves of a schedule in order.
func (r *Run) Play(ctx context.Context, moves []Move) error {
	for i, m := range moves {
		if err := r.Advance(ctx, m); err != nil {
			return fmt.Errorf("error at move %d of the schedule (%s): %w", i+1, m, err)
		}
	}
	return nil
}

// PlaySeed plays an interleaving drawn from seed until the run is over:
// at each step one attempt that can move (ready or paused), drawn
// uniformly; when none can but some are blocked in the store, the lab's
// bounded waits end ("wait"). The same seed draws the same moves as long
// as the store answers the same way, which is what a schedule promises.
func (r *Run) PlaySeed(ctx context.Context, seed uint64) error {
	rng := mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for range MaxMoves {
		r.mu.Lock()
		if r.overLocked() || r.aborted != "" {
			r.mu.Unlock()
			return nil
		}
		var movable []int
		blocked := false
		for _, a := range r.attempts {
			switch a.state {
			case StateReady, StatePaused:
				movable = append(movable, a.n)
			case StateBlocked, StateMoving:
				blocked = true
			}
		}
		r.mu.Unlock()
		m := E(lab.EventWait)
		switch {
		case len(movable) > 0:
			m = A(movable[rng.IntN(len(movable))])
		case !blocked:
			return nil
		}
		if err := r.Advance(ctx, m); err != nil {
			return fmt.Errorf("error at a drawn move (%s): %w", m, err)
		}
	}
	return fmt.Errorf("the drawn schedule did not end the run within %d moves", MaxMoves)
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
	ans := r.hooks.Send(r.ctx, a.n, r.spec.Key, r.id+"/"+strconv.Itoa(a.n))
	r.mu.Lock()
	a.answer, a.point, a.turn, a.answerAt = &ans, "", nil, time.Now()
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

// Name is the attempt's "<run id>/<attempt>".
func (g gate) Name() string { return g.r.id + "/" + strconv.Itoa(g.a.n) }

// WaitEnds is closed by the next "wait" move made while the attempt waits.
func (g gate) WaitEnds() <-chan struct{} {
	g.r.mu.Lock()
	defer g.r.mu.Unlock()
	return g.a.waitEnds
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
