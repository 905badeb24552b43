package labsvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/step"
	"github.com/idempotency-lab/lab/lab/tenants"
	"github.com/idempotency-lab/lab/lab/variant"
)

// ErrSteppingOff says this server steps no runs.
var ErrSteppingOff = errors.New("this server steps no runs")

// StepRequest starts a stepped run: a named schedule, which sets the rest,
// or a store with its attempts, replicas and faults.
type StepRequest struct {
	Schedule string
	Store    lab.StoreName
	Attempts int
	Replicas int
	// Faults is the Lab-Fault of the first attempt; the store's parameters
	// in it (ttl_ms, window_ms) go with every attempt.
	Faults lab.Faults
	// Play plays the named schedule to its end (else it is only opened,
	// to be advanced move by move).
	Play bool
}

// Faults a stepped run refuses: time decides them, and in a stepped run
// the moves do (each has its event).
var timeDrivenFaults = map[lab.FaultPoint]string{
	lab.FaultSlow:         "the work is a pause point (after_claim): advance the attempt when its work is done",
	lab.FaultStaleWorker:  "a paused attempt is a stalled worker: make its claim's lifetime end with the ttl or lease move",
	lab.FaultExpired:      "make the retention window pass with the window move",
	lab.FaultStoreRestart: "restart the store with POST /lab/restart-store between moves",
}

// StartStep opens a stepped run in id's namespace, and plays its schedule
// when asked. Its attempts go round-robin to the replicas, as a run's do;
// each is a real POST /charges of id's tenant under a key of the stepped
// run's own.
func (s *Service) StartStep(ctx context.Context, id tenants.Identity, req StepRequest) (*step.Run, error) {
	if s.cfg.Steps == nil {
		return nil, ErrSteppingOff
	}
	var sched step.Schedule
	if req.Schedule != "" {
		var ok bool
		if sched, ok = step.FindSchedule(req.Schedule); !ok {
			return nil, lab.Invalid("schedule", "names no schedule of GET /lab/step (got %q)", req.Schedule)
		}
		faults, err := lab.ParseFaults(sched.Faults)
		if err != nil {
			return nil, fmt.Errorf("schedule %s: %w", sched.Name, err)
		}
		req.Store, req.Attempts, req.Replicas, req.Faults = sched.Store, sched.Attempts, sched.Replicas, faults
	}
	if why, ok := timeDrivenFaults[req.Faults.Point]; ok {
		return nil, lab.Invalid("fault", "%s is driven by time, which a stepped run replaces with moves: %s", req.Faults.Point, why)
	}
	if _, err := s.Store(req.Store); err != nil {
		return nil, err
	}
	if max := s.cfg.Replicas.MaxReplicas(); req.Replicas < 1 || req.Replicas > max {
		return nil, lab.Invalid("replicas", "must be in 1..%d (got %d)", max, req.Replicas)
	}
	if req.Attempts < step.MinAttempts || req.Attempts > step.MaxAttempts {
		return nil, lab.Invalid("attempts", "must be in %d..%d for a stepped run (got %d)", step.MinAttempts, step.MaxAttempts, req.Attempts)
	}
	if req.Faults.Point == lab.FaultFailover {
		if req.Store != "redis" {
			return nil, lab.Invalid("fault", "failover is a move of a stepped run on redis, whose claims live in the failing Redis (got store %s)", req.Store)
		}
		req.Faults.OnPair = true // every attempt claims on the pair
	}
	if req.Faults.Point == lab.FaultPGFailover {
		if v, _ := s.cfg.Variants.Get(req.Store); !slices.Contains(v.Needs, variant.NeedPostgres) {
			return nil, lab.Invalid("fault", "pg_failover is a move of a stepped run on a store whose keys are in PostgreSQL (postgres, lease, phases, redis+postgres; got %s)", req.Store)
		}
		if s.cfg.PGFailover == nil || s.cfg.PGFailover.Unavailable() != "" {
			return nil, fmt.Errorf("%w: the pg_failover move needs the lab's PostgreSQL pair", lab.ErrStoreUnavailable)
		}
	}
	targets, err := s.cfg.Replicas.Targets(ctx, req.Replicas)
	if err != nil {
		return nil, err
	}
	for _, t := range targets {
		if _, ok := s.cfg.Replicas.StoresAt(t); !ok {
			return nil, lab.Invalid("replicas", "a stepped run uses this process's replicas only, and %s is a peer process (cluster mode): give replicas=1", t)
		}
	}
	spec := step.Spec{Namespace: id.Namespace, Store: req.Store, Attempts: req.Attempts, Schedule: sched.Name,
		Planned: sched.Steps, Faults: req.Faults.String()}
	for n := range req.Attempts {
		spec.Replicas = append(spec.Replicas, targets[n%len(targets)])
	}
	st := &stepped{s: s, id: id, req: req}
	if err := st.holdReplication(ctx); err != nil {
		return nil, err
	}
	run, err := s.cfg.Steps.Start(spec, step.Hooks{Send: st.send, Happen: st.happen, Inspect: st.inspect, Over: st.over})
	if err != nil {
		st.promote(ctx)
		return nil, err
	}
	st.run = run
	if sched.Name != "" && req.Play {
		if err := run.Play(ctx, sched.Steps); err != nil {
			return run, err
		}
	}
	return run, nil
}

// StepMoves are the time-driven moves each available design has: its
// own, the end of the lab's bounded waits, which every design has, and a
// PostgreSQL failover for those whose keys are in PostgreSQL.
func (s *Service) StepMoves() map[lab.StoreName][]lab.TimeEvent {
	out := map[lab.StoreName][]lab.TimeEvent{}
	for name, st := range s.cfg.Stores {
		moves := []lab.TimeEvent{lab.EventWait}
		if tm, ok := st.(lab.TimeMover); ok {
			moves = tm.TimeMoves()
		}
		if v, _ := s.cfg.Variants.Get(name); slices.Contains(v.Needs, variant.NeedPostgres) && s.cfg.PGFailover != nil {
			moves = append(slices.Clone(moves), lab.EventPGFailover) // its keys are where PostgreSQL fails over
		}
		out[name] = moves
	}
	return out
}

// CurrentStep is ns's stepped run in progress, if any.
func (s *Service) CurrentStep(ns lab.Namespace) (*step.Run, bool) {
	if s.cfg.Steps == nil {
		return nil, false
	}
	return s.cfg.Steps.Current(ns)
}

// FindStep is one of ns's stepped runs.
func (s *Service) FindStep(ns lab.Namespace, runID string) (*step.Run, error) {
	if s.cfg.Steps == nil {
		return nil, ErrSteppingOff
	}
	return s.cfg.Steps.Find(ns, runID)
}

// stepped is one stepped run as the lab serves its hooks.
type stepped struct {
	s   *Service
	id  tenants.Identity
	req StepRequest
	run *step.Run // set once started, before any move

	mu       sync.Mutex
	held     bool // the Redis pair's replication is held for this run's failover move
	pgHeld   bool // the PostgreSQL pair's standby is held for this run's pg_failover move
	promoted bool // and the move was made
}

// onPG reports a stepped run whose attempts charge on the PostgreSQL pair.
func (st *stepped) onPG() bool { return st.req.Faults.Replication != "" }

// holdReplication holds the pair of a failover run back: from now on
// only the primary acknowledges the attempts' claims (Redis) or commits
// (PostgreSQL).
func (st *stepped) holdReplication(ctx context.Context) error {
	switch st.req.Faults.Point {
	case lab.FaultPGFailover:
		if err := st.s.cfg.PGFailover.Hold(ctx, st.id.Namespace, st.req.Faults.Replication); err != nil {
			return err
		}
		st.mu.Lock()
		st.pgHeld = true
		st.mu.Unlock()
		return nil
	case lab.FaultFailover:
	default:
		return nil
	}
	if st.s.cfg.Failover == nil {
		return fmt.Errorf("%w: the failover move needs the lab's Redis pair (-redis-pair)", lab.ErrStoreUnavailable)
	}
	if _, err := st.s.cfg.Failover.Failover(ctx, st.id.Namespace, "hold"); err != nil {
		return err
	}
	st.mu.Lock()
	st.held = true
	st.mu.Unlock()
	return nil
}

// promote ends the run's hold, if it holds one: the replica is promoted.
// A PostgreSQL pair is settled: promoted if it was not, then rebuilt.
func (st *stepped) promote(ctx context.Context) error {
	st.mu.Lock()
	pgHeld := st.pgHeld
	st.pgHeld = false
	st.mu.Unlock()
	if pgHeld {
		_, err := st.s.cfg.PGFailover.Settle(context.WithoutCancel(ctx), st.id.Namespace, st.run.ID())
		return err
	}
	st.mu.Lock()
	held := st.held
	st.held = false
	st.mu.Unlock()
	if !held {
		return nil
	}
	_, err := st.s.cfg.Failover.Failover(context.WithoutCancel(ctx), st.id.Namespace, "promote")
	return err
}

// scope is the run's key as the stores scope it.
func (st *stepped) scope() lab.Scope {
	return lab.Scope{Namespace: st.id.Namespace, Tenant: st.id.Tenant, Endpoint: lab.Endpoint, Key: st.run.Spec().Key}
}

// targets are the distinct replicas the run's attempts reach, in order.
func (st *stepped) targets() []string {
	var ts []string
	for _, t := range st.run.Spec().Replicas {
		if !slices.Contains(ts, t) {
			ts = append(ts, t)
		}
	}
	return ts
}

// stores are the run's store on each distinct replica it reaches, named
// for a reader ("replica 2" when there are several).
func (st *stepped) stores(ctx context.Context) ([]lab.Store, []string, error) {
	if st.onPG() {
		store, err := st.s.PairStore(ctx, st.req.Store)
		return []lab.Store{store}, []string{""}, err
	}
	ts := st.targets()
	var stores []lab.Store
	var names []string
	for i, t := range ts {
		found, ok := st.s.cfg.Replicas.StoresAt(t)
		if !ok {
			return nil, nil, fmt.Errorf("%w: replica %s is not in this process: a stepped run uses in-process replicas only", lab.ErrStoreUnavailable, t)
		}
		store, ok := found[st.req.Store]
		if !ok {
			return nil, nil, fmt.Errorf("%w: replica %s has no store %s", lab.ErrStoreUnavailable, t, st.req.Store)
		}
		stores = append(stores, store)
		if len(ts) > 1 {
			names = append(names, fmt.Sprintf("replica %d", i+1))
		} else {
			names = append(names, "")
		}
	}
	return stores, names, nil
}

// happen makes e happen to the run's key on every replica's store (a
// shared store makes it happen once and then finds nothing left to do).
// "wait" has already ended the waits held in the attempts' requests; a
// store with waits of its own (a lock wait) ends them too.
func (st *stepped) happen(ctx context.Context, e lab.TimeEvent) (string, error) {
	if e == lab.EventPGFailover {
		return st.failPGOver(ctx)
	}
	if e == lab.EventFailover {
		st.mu.Lock()
		held := st.held
		st.mu.Unlock()
		if !held {
			return "", lab.Invalid("event", "failover needs a stepped run on redis started with fault=failover (and fails over once)")
		}
		if err := st.promote(ctx); err != nil {
			return "", err
		}
		return "Redis failed over: the replica, which never saw the writes held back, is the primary now", nil
	}
	stores, names, err := st.stores(ctx)
	if err != nil {
		return "", err
	}
	var did []string
	for i, store := range stores {
		tm, ok := store.(lab.TimeMover)
		if !ok {
			if e == lab.EventWait {
				continue
			}
			return "", lab.Invalid("event", "%s has no %s to make happen", st.req.Store, e)
		}
		if err := tm.MakeHappen(ctx, st.scope(), e); err != nil {
			return "", err
		}
		if names[i] != "" {
			did = append(did, names[i])
		}
	}
	what := map[lab.TimeEvent]string{lab.EventTTL: "the claim's TTL ran out", lab.EventLease: "the claim's lease ended",
		lab.EventWindow: "the retention window passed", lab.EventWait: "the lab's bounded waits ended"}[e]
	if len(did) > 0 {
		what += " (" + strings.Join(did, ", ") + ")"
	}
	return what, nil
}

// failPGOver is the pg_failover move: the standby, which received nothing
// since the run began, is promoted, and the old primary fenced.
func (st *stepped) failPGOver(ctx context.Context) (string, error) {
	st.mu.Lock()
	ok := st.pgHeld && !st.promoted
	st.promoted = true
	st.mu.Unlock()
	if !ok {
		return "", lab.Invalid("event", "pg_failover needs a stepped run started with fault=pg_failover (and fails over once)")
	}
	ns := st.id.Namespace
	if err := st.s.cfg.PGFailover.Promote(context.WithoutCancel(ctx), ns, nil); err != nil {
		return "", err
	}
	if err := st.s.cfg.PGFailover.Fence(context.WithoutCancel(ctx), ns); err != nil {
		return "", err
	}
	return "PostgreSQL failed over: the standby, which received nothing since the run began, is the primary now; the old primary's sessions were ended", nil
}

// inspect reads what each replica's store holds for the run's key.
func (st *stepped) inspect(ctx context.Context) []lab.KeyInspection {
	if st.onPG() {
		return st.s.cfg.PGFailover.Inspect(ctx, st.req.Store, st.scope())
	}
	stores, names, err := st.stores(ctx)
	if err != nil {
		return []lab.KeyInspection{{Where: string(st.req.Store), State: "unknown", Facts: []string{err.Error()}}}
	}
	out := []lab.KeyInspection{}
	for i, store := range stores {
		ki, ok := store.(lab.KeyInspector)
		if !ok {
			continue
		}
		in, err := ki.Inspect(ctx, st.scope())
		if err != nil {
			in = lab.KeyInspection{Where: string(st.req.Store), State: "unknown", Facts: []string{err.Error()}}
		}
		if in.Facts == nil {
			in.Facts = []string{}
		}
		if in.Shared { // one key for every replica: read once
			return []lab.KeyInspection{in}
		}
		if names[i] != "" {
			in.Where = names[i] + ": " + in.Where
		}
		out = append(out, in)
	}
	return out
}

// send sends one stepped attempt as a client would, and reads its answer.
// The first attempt carries the run's fault; every attempt its store
// parameters.
func (st *stepped) send(ctx context.Context, n int, key, header string) step.Answer {
	target := st.run.Spec().Replicas[n-1]
	faults := st.req.Faults
	if n > 1 {
		faults.Point = ""
	}
	body := fmt.Sprintf(`{"account":%q,"amount_cents":%d,"currency":"USD"}`, DefaultAccount, DefaultAmount)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/charges?store="+url.QueryEscape(string(st.req.Store)), strings.NewReader(body))
	if err != nil {
		return step.Answer{Error: fmt.Sprintf("error building the request: %v", err)}
	}
	// Sent once: Go's transport would resend a request carrying an
	// Idempotency-Key on a dropped kept-alive connection (a crash), and a
	// stepped attempt's gate is taken once.
	hr.GetBody = nil
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Authorization", "Bearer "+st.id.Token)
	hr.Header.Set(lab.KeyHeader, key)
	hr.Header.Set(step.Header, header)
	if f := faults.String(); f != "" {
		hr.Header.Set(lab.FaultHeader, f)
	}
	// No client timeout: a stepped attempt waits for its turn as long as
	// the run lives, and the run's end cancels ctx.
	client := &http.Client{Transport: st.s.cfg.Runner.Client.Transport}
	resp, err := client.Do(hr)
	if err != nil {
		return step.Answer{Error: fmt.Sprintf("error sending the attempt: %v", err)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	ans := step.Answer{Status: resp.StatusCode, Replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		Replica: resp.Header.Get(experiment.ReplicaHeader)}
	if err != nil {
		ans.Error = fmt.Sprintf("error reading the answer: %v", err)
		return ans
	}
	var charge struct {
		ID string `json:"id"`
	}
	if resp.StatusCode < 300 && json.Unmarshal(data, &charge) == nil {
		ans.ChargeID = charge.ID
	}
	if resp.StatusCode >= 400 {
		var p struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(data, &p) == nil {
			ans.Code = p.Code
		}
	}
	return ans
}

// StepCharges reads the charges of a stepped run's key where its attempts
// charged: the lab's books, or, on a pg_failover run, the PostgreSQL pair's.
func (s *Service) StepCharges(ctx context.Context, tenant string, v step.View) (lab.KeyTally, error) {
	books := s.cfg.Runner.Books
	if f, err := lab.ParseFaults(v.Faults); err == nil && f.Replication != "" && s.cfg.PGFailover != nil {
		if books, err = s.cfg.PGFailover.Books(ctx); err != nil {
			return lab.KeyTally{}, err
		}
	}
	return books.KeyCharges(ctx, tenant, v.Store, v.Key)
}

// StepGate resolves a stepped attempt's Lab-Step header for a caller of ns.
func (s *Service) StepGate(ns lab.Namespace, header string) (lab.StepGate, error) {
	if s.cfg.Steps == nil {
		return nil, lab.Invalid(step.Header, "this server steps no runs")
	}
	return s.cfg.Steps.Gate(ns, header)
}
