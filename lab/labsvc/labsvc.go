// Package labsvc holds the lab's use cases apart from HTTP: a run fired at
// the replicas and kept in its namespace's history, the breakage and
// effects matrices, the bound on slow attempts, and a reset that reaches
// every replica. lab/api calls it for its routes and cmd/lab for its
// commands. Each replica has its own, as a separate process would: its
// stores, its history, its slow attempts.
package labsvc

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/history"
	"github.com/idempotency-lab/lab/lab/step"
	"github.com/idempotency-lab/lab/lab/tenants"
	"github.com/idempotency-lab/lab/lab/variant"
)

// What a matrix charges, as the peer lab's defaults.
const (
	DefaultAccount = "acct-1"
	DefaultAmount  = 2500
)

// Bounds on what one namespace may hold of a replica.
const (
	// MaxRunHistory bounds each namespace's runs of its own, and apart
	// from them its matrix cells: one attendee's runs never push out
	// another's, and a matrix never pushes out one's own.
	MaxRunHistory = 100
	// MaxSlowAttempts bounds a namespace's slow attempts in flight on a
	// replica at once: one run's worth.
	MaxSlowAttempts = 64
	// MaxNamespaceRuns bounds a namespace's runs, checks and matrices in flight on a
	// replica: a person fires one at a time, the page two (its comparison).
	MaxNamespaceRuns = 2
)

// RunLimitError refuses a run or a check: the namespace has its share in
// flight (Namespace), or the replica its limit, every namespace's together.
type RunLimitError struct {
	Namespace bool
	Limit     int
}

func (e *RunLimitError) Error() string {
	if e.Namespace {
		return fmt.Sprintf("this namespace already has %d runs in flight on this replica: wait for one to end", e.Limit)
	}
	return fmt.Sprintf("the lab is running %d runs at once, its limit (-max-runs); nothing was run: retry after the Retry-After delay", e.Limit)
}

// SlowLimitError refuses a slow attempt over the namespace's share.
type SlowLimitError struct{ Limit int }

func (e *SlowLimitError) Error() string {
	return fmt.Sprintf("this namespace already has %d slow attempts in flight on this replica", e.Limit)
}

// ErrEffectsRunning refuses a second effects matrix in one namespace: the
// provider's faults are the namespace's while one runs.
var ErrEffectsRunning = errors.New("this namespace is already running the effects matrix: the provider's faults are the namespace's while it runs; wait for it to end")

// Replicas are the lab's replicas as a run reaches them.
type Replicas interface {
	// Targets returns the base URLs of n replicas (attempts go round-robin).
	Targets(ctx context.Context, n int) ([]string, error)
	// MaxReplicas is how many replicas Targets can give.
	MaxReplicas() int
	// PairUnavailable says why the failover fault cannot run ("" when it can).
	PairUnavailable() string
	// ResetOthers makes every replica but self forget a namespace's keys
	// and runs ("" for every namespace): in-process replicas are told the
	// namespace; peer processes (cluster mode) are asked with the caller's
	// credentials, which their own API resolves.
	ResetOthers(ctx context.Context, self string, ns lab.Namespace, credentials string) error
	// StoresAt is the stores of the in-process replica at target (a base
	// URL Targets gave), false for a peer process or none.
	StoresAt(target string) (map[lab.StoreName]lab.Store, bool)
}

// Erasable is what a reset deletes in the books: a namespace's ledger,
// outbox, webhooks and runs.
type Erasable interface {
	Reset(ctx context.Context, ns lab.Namespace) error
}

// ProviderRecords is what a reset deletes of the payment provider's records.
type ProviderRecords interface {
	Reset(ctx context.Context, ns string) error
}

// Config is what one replica's use cases work with. Every field is
// required but Unavailable.
type Config struct {
	Runner      *experiment.Runner
	Books       Erasable
	Provider    ProviderRecords
	Variants    *variant.Registry
	Stores      map[lab.StoreName]lab.Store // this replica's, one per available variant
	Unavailable map[lab.StoreName]string    // variant -> how to enable it
	Replicas    Replicas
	Replica     string        // this replica's name, among Replicas
	Window      time.Duration // the dedupe window, reported by runs
	// Steps holds the process's stepped runs, shared by its in-process
	// replicas; nil when the lab steps no runs.
	Steps *step.Registry
	// Failover steps the lab's Redis pair ("hold", then "promote") for a
	// stepped run's failover move; nil without a pair.
	Failover Failover
	// PGFailover is the lab's PostgreSQL pair, where pg_failover runs
	// charge; nil without one.
	PGFailover PGFailover
	// MaxRuns bounds the runs and checks in flight on this replica, every
	// namespace's together; 0: no bound.
	MaxRuns int
}

// PGFailover is the lab's PostgreSQL primary and standby as the charge
// path, a reset and a stepped run reach it.
type PGFailover interface {
	experiment.PGFailover
	// Fence ends every session on ns's old primary, once promoted.
	Fence(ctx context.Context, ns lab.Namespace) error
	// Inspect reads store's row for sc on each server of the pair.
	Inspect(ctx context.Context, store lab.StoreName, sc lab.Scope) []lab.KeyInspection
	// Store is the named store opened on the pair, which starts on first use.
	Store(ctx context.Context, name lab.StoreName) (lab.Store, error)
	// Reset deletes a namespace's rows on the pair ("" every namespace's).
	Reset(ctx context.Context, ns lab.Namespace) error
	// Unavailable says why pg_failover cannot run here ("" when it can).
	Unavailable() string
}

// Failover moves the lab's Redis pair through a failover for a namespace.
type Failover interface {
	Failover(ctx context.Context, ns lab.Namespace, step string) (string, error)
}

// Service is one replica's use cases.
type Service struct {
	cfg Config

	mu   sync.Mutex
	runs map[lab.Namespace][]experiment.Report // recent runs per namespace, newest last, bounded
	slow map[lab.Namespace]int                 // slow attempts in flight, per namespace
	// running counts the runs and checks in flight, per namespace and in all.
	running      map[lab.Namespace]int
	runningTotal int
	// effects and checking mark the namespaces running the effects matrix,
	// or checking a design, here.
	effects  map[lab.Namespace]bool
	checking map[lab.Namespace]bool
	pictures map[string][]byte // run id -> its history's picture, drawn once
}

// New returns a replica's use cases.
func New(cfg Config) (*Service, error) {
	if cfg.Runner == nil || cfg.Books == nil || cfg.Provider == nil || cfg.Variants == nil || cfg.Replicas == nil {
		return nil, errors.New("labsvc: runner, books, provider, variants and replicas are required")
	}
	return &Service{cfg: cfg, runs: map[lab.Namespace][]experiment.Report{}, slow: map[lab.Namespace]int{},
		running: map[lab.Namespace]int{}, effects: map[lab.Namespace]bool{}, checking: map[lab.Namespace]bool{}, pictures: map[string][]byte{}}, nil
}

// Replicas are the replicas this service's runs reach.
func (s *Service) Replicas() Replicas { return s.cfg.Replicas }

// Store is this replica's store of a registered design, or why it has none.
func (s *Service) Store(name lab.StoreName) (lab.Store, error) {
	if _, ok := s.cfg.Variants.Get(name); !ok {
		names := make([]string, 0, len(s.cfg.Variants.Names()))
		for _, n := range s.cfg.Variants.Names() {
			names = append(names, string(n))
		}
		return nil, lab.Invalid("store", "must be one of %s (got %q)", strings.Join(names, ", "), name)
	}
	st, ok := s.cfg.Stores[name]
	if !ok {
		how := cmp.Or(s.cfg.Unavailable[name], "it is not configured on this server")
		return nil, fmt.Errorf("%w: store %q is not available: %s", lab.ErrStoreUnavailable, name, how)
	}
	return st, nil
}

// pgPairUnavailable says why the PostgreSQL failover cannot run here, ""
// when it can (which designs it applies to is experiment.Case.AppliesTo's).
func (s *Service) pgPairUnavailable() string {
	if s.cfg.PGFailover == nil {
		return "this lab has no PostgreSQL pair"
	}
	return s.cfg.PGFailover.Unavailable()
}

// PairStore is the named store on the lab's PostgreSQL pair, where the
// attempts of a pg_failover run charge.
func (s *Service) PairStore(ctx context.Context, name lab.StoreName) (lab.Store, error) {
	if s.cfg.PGFailover == nil {
		return nil, fmt.Errorf("%w: this lab has no PostgreSQL pair", lab.ErrStoreUnavailable)
	}
	if how := s.cfg.PGFailover.Unavailable(); how != "" {
		return nil, fmt.Errorf("%w: %s", lab.ErrStoreUnavailable, how)
	}
	return s.cfg.PGFailover.Store(ctx, name)
}

// Run fires one lab run on n replicas and keeps it in the history.
func (s *Service) Run(ctx context.Context, spec experiment.Spec, replicas int) (experiment.Report, error) {
	if _, err := s.Store(spec.Store); err != nil {
		return experiment.Report{}, err
	}
	release, err := s.admitRun(spec.Namespace)
	if err != nil {
		return experiment.Report{}, err
	}
	defer release()
	targets, err := s.cfg.Replicas.Targets(ctx, replicas)
	if err != nil {
		return experiment.Report{}, err
	}
	rep, err := s.cfg.Runner.Run(ctx, spec, targets)
	if err != nil {
		return rep, err
	}
	if rep.DedupeWindowMS == 0 {
		rep.DedupeWindowMS = s.cfg.Window.Milliseconds()
	}
	s.remember(rep)
	return rep, nil
}

// remember keeps a run, timeline and all, in its namespace's history, so
// it can be opened again.
func (s *Service) remember(rep experiment.Report) {
	s.mu.Lock()
	defer s.mu.Unlock()
	runs := append(s.runs[rep.Namespace], rep)
	kept, own, cells := make([]experiment.Report, 0, len(runs)), 0, 0
	for i := len(runs) - 1; i >= 0; i-- {
		if runs[i].Matrix == "" {
			own++
		} else {
			cells++
		}
		if runs[i].Matrix == "" && own <= MaxRunHistory || runs[i].Matrix != "" && cells <= MaxRunHistory {
			kept = append(kept, runs[i])
		}
	}
	slices.Reverse(kept)
	s.runs[rep.Namespace] = kept
}

// Runs lists the runs of view ("" for every namespace), newest first;
// without their timelines, events and ledger rows unless whole.
func (s *Service) Runs(view lab.Namespace, whole bool) []experiment.Report {
	s.mu.Lock()
	var runs []experiment.Report
	for ns, rs := range s.runs {
		if view == "" || ns == view {
			runs = append(runs, rs...)
		}
	}
	s.mu.Unlock()
	slices.SortStableFunc(runs, func(x, y experiment.Report) int { return y.StartedAt.Compare(x.StartedAt) })
	if !whole {
		for i := range runs {
			runs[i].Timeline, runs[i].Events, runs[i].LedgerRows = nil, nil, nil
		}
	}
	return runs
}

// FindRun is one of view's recent runs on this replica, whole.
func (s *Service) FindRun(view lab.Namespace, id string) (experiment.Report, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ns, rs := range s.runs {
		if view != "" && ns != view {
			continue
		}
		for _, r := range rs {
			if r.RunID == id {
				return r, true
			}
		}
	}
	return experiment.Report{}, false
}

// Matrix runs every store against every case in id's namespace, each cell
// a real run kept in the history.
func (s *Service) Matrix(ctx context.Context, id tenants.Identity, progress func(done, total int, c experiment.Case, cell experiment.Cell)) (experiment.Matrix, error) {
	if n := s.cfg.Replicas.MaxReplicas(); n < 3 {
		return experiment.Matrix{}, lab.Invalid("replicas", "the matrix needs 3 replicas; this server has %d", n)
	}
	release, err := s.admitRun(id.Namespace) // a matrix is one run for the limits: its cells run one at a time
	if err != nil {
		return experiment.Matrix{}, err
	}
	defer release()
	second := id.Second()
	m, err := s.cfg.Runner.RunMatrix(ctx, experiment.MatrixRequest{
		Stores: s.cfg.Variants.Names(),
		Unavailable: func(store lab.StoreName) string {
			if _, ok := s.cfg.Stores[store]; ok {
				return ""
			}
			return cmp.Or(s.cfg.Unavailable[store], "not available on this server")
		},
		PairUnavailable:   s.cfg.Replicas.PairUnavailable(),
		PGPairUnavailable: s.pgPairUnavailable(),
		Targets:           s.cfg.Replicas.Targets, Namespace: id.Namespace, Tenant: id.Tenant, Token: id.Token,
		OtherTenant: second.Tenant, Other: second.Token, Account: DefaultAccount, Amount: DefaultAmount,
		Progress: func(done, total int, c experiment.Case, cell experiment.Cell) {
			if cell.Run != nil {
				s.remember(*cell.Run)
			}
			cell.Schedule = step.ForCell(cell.Store, c.Name)
			if progress != nil {
				progress(done, total, c, cell)
			}
		},
	})
	for _, row := range m.Rows {
		for i := range row.Cells {
			row.Cells[i].Schedule = step.ForCell(row.Cells[i].Store, row.Case.Name)
		}
	}
	return m, err
}

// effectStores picks the store of each transport: the first available
// variant sending directly, and the first keyed one writing an outbox whose
// concurrent retries hold: the matrix judges the effects of one charge, so
// the charge itself must be decided once.
func (s *Service) effectStores() (map[string]lab.StoreName, error) {
	out := map[string]lab.StoreName{}
	for _, v := range s.cfg.Variants.All() {
		if _, ok := s.cfg.Stores[v.Name]; !ok {
			continue
		}
		keyed := v.RequiresKey && v.Mechanisms[variant.CaseRetries].Usual == lab.Holds
		if _, have := out[v.Effects]; !have && (v.Effects == "direct" || keyed) {
			out[v.Effects] = v.Name
		}
	}
	if out["direct"] == "" || out["outbox"] == "" {
		return nil, lab.Invalid("store", "the effects matrix needs a variant that sends directly and a keyed one with an outbox whose retries hold")
	}
	return out, nil
}

// Effects runs the effects matrix in id's namespace, one at a time per
// namespace on this replica.
func (s *Service) Effects(ctx context.Context, id tenants.Identity, progress func(done, total int, c experiment.EffectCase, d experiment.EffectDesign)) (experiment.EffectMatrix, error) {
	stores, err := s.effectStores()
	if err != nil {
		return experiment.EffectMatrix{}, err
	}
	s.mu.Lock()
	if s.effects[id.Namespace] {
		s.mu.Unlock()
		return experiment.EffectMatrix{}, ErrEffectsRunning
	}
	s.effects[id.Namespace] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.effects, id.Namespace)
		s.mu.Unlock()
	}()
	release, err := s.admitRun(id.Namespace)
	if err != nil {
		return experiment.EffectMatrix{}, err
	}
	defer release()
	targets, err := s.cfg.Replicas.Targets(ctx, 1)
	if err != nil {
		return experiment.EffectMatrix{}, err
	}
	return s.cfg.Runner.RunEffects(ctx, experiment.EffectsRequest{
		Target: targets[0], Tenant: id.Tenant, Token: id.Token, Namespace: id.Namespace, Stores: stores,
		Account: DefaultAccount, Amount: DefaultAmount, Progress: progress,
	})
}

// admitRun counts a run or a check of ns in, or refuses it
// (RunLimitError) when the namespace has its share in flight, or the
// replica its limit: refused, nothing runs, and a shed client comes back
// after Retry-After while everyone else's runs go on as fast as before.
func (s *Service) admitRun(ns lab.Namespace) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[ns] >= MaxNamespaceRuns {
		return nil, &RunLimitError{Namespace: true, Limit: MaxNamespaceRuns}
	}
	if s.cfg.MaxRuns > 0 && s.runningTotal >= s.cfg.MaxRuns {
		return nil, &RunLimitError{Limit: s.cfg.MaxRuns}
	}
	s.running[ns]++
	s.runningTotal++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.runningTotal--
		if s.running[ns]--; s.running[ns] == 0 {
			delete(s.running, ns)
		}
	}, nil
}

// AdmitSlow counts a slow attempt of ns in, or refuses it (SlowLimitError)
// when the namespace already has its share in flight on this replica.
func (s *Service) AdmitSlow(ns lab.Namespace) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slow[ns] >= MaxSlowAttempts {
		return nil, &SlowLimitError{Limit: MaxSlowAttempts}
	}
	s.slow[ns]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.slow[ns]--; s.slow[ns] == 0 {
			delete(s.slow, ns)
		}
	}, nil
}

// ResetLocal forgets this replica's keys of a namespace ("" for every
// namespace) and its runs.
func (s *Service) ResetLocal(ctx context.Context, ns lab.Namespace) error {
	for name, st := range s.cfg.Stores {
		r, ok := st.(lab.Resetter)
		if !ok {
			continue // a store without keys has nothing to forget
		}
		if err := r.Reset(ctx, ns); err != nil {
			return fmt.Errorf("error resetting store %s: %w", name, err)
		}
	}
	s.mu.Lock()
	if ns == "" {
		clear(s.runs)
	} else {
		delete(s.runs, ns)
	}
	s.mu.Unlock()
	return nil
}

// Reset deletes a namespace ("" every namespace) everywhere: this
// replica's keys and runs, the ledger, outbox, webhooks and runs in the
// books, the provider's records, and every other replica's keys and runs.
// credentials are the caller's, for the peer processes that resolve them.
func (s *Service) Reset(ctx context.Context, ns lab.Namespace, credentials string) error {
	if err := s.ResetLocal(ctx, ns); err != nil {
		return err
	}
	if err := s.cfg.Books.Reset(ctx, ns); err != nil {
		return fmt.Errorf("error resetting the books: %w", err)
	}
	if s.cfg.PGFailover != nil {
		if err := s.cfg.PGFailover.Reset(ctx, ns); err != nil {
			return fmt.Errorf("error resetting the PostgreSQL pair: %w", err)
		}
	}
	if err := s.cfg.Provider.Reset(ctx, string(ns)); err != nil {
		return fmt.Errorf("error resetting the provider's records: %w", err)
	}
	if err := s.cfg.Replicas.ResetOthers(ctx, s.cfg.Replica, ns, credentials); err != nil {
		return fmt.Errorf("error resetting the other replicas: %w", err)
	}
	return nil
}

// maxPictures bounds the pictures kept: past it they are drawn afresh.
const maxPictures = 256

// Picture is one of view's recent runs drawn as its history's picture
// (porcupine's visualization, one self-contained page). A run's picture is
// drawn once and kept: drawing searches the run's orders again, which no
// caller should be able to repeat at will on a shared lab.
func (s *Service) Picture(view lab.Namespace, id string) ([]byte, bool, error) {
	r, ok := s.FindRun(view, id)
	if !ok {
		return nil, false, nil
	}
	s.mu.Lock()
	page, drawn := s.pictures[id]
	s.mu.Unlock()
	if drawn {
		return page, true, nil
	}
	var b bytes.Buffer
	if err := history.Check(r.History, history.DefaultTimeout).WriteHTML(&b); err != nil {
		return nil, true, err
	}
	s.mu.Lock()
	if len(s.pictures) >= maxPictures {
		clear(s.pictures)
	}
	s.pictures[id] = b.Bytes()
	s.mu.Unlock()
	return b.Bytes(), true, nil
}
