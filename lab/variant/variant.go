// Package variant is the registry of idempotency designs. Each design lives
// in a package of its own under variants/ and declares itself once, as a
// Variant: its name, how it decides, where its keys live, what it needs,
// how it usually fares in each case of the lab, and how to open it. The API,
// the assembly, the matrix, the index and the page all iterate over the
// registry, so adding a design is one package and one line.
package variant

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// Need is a service a variant cannot run without.
type Need string

// Services a variant may need.
const (
	NeedRedis    Need = "redis"
	NeedPostgres Need = "postgres"
)

// Case names a situation of the lab: a plain retry storm, a storm over
// several replicas, a scenario, or a fault point.
type Case string

// Cases besides the fault points (see FaultCase).
const (
	CaseRetries  Case = "retries"  // concurrent retries on one replica
	CaseReplicas Case = "replicas" // concurrent retries over several replicas
	CaseReused   Case = "reused"   // the same key with another amount
	CaseTenants  Case = "tenants"  // two tenants, one key
)

// FaultCase is the case of a run with fault point p.
func FaultCase(p lab.FaultPoint) Case { return Case(p) }

// Mechanism explains one (variant, case): the verdict the design usually
// reaches there, and why it holds or breaks.
type Mechanism struct {
	Usual lab.Verdict
	// UsualWith, when set, says the usual verdict from the run's fault
	// parameters (a claim TTL against the work, say) instead of Usual.
	UsualWith func(f lab.Faults) lab.Verdict
	Holds     string // why it holds, when it does
	Breaks    string // why it breaks, when it does
}

// Expected is the verdict the mechanism usually reaches under faults f.
func (m Mechanism) Expected(f lab.Faults) lab.Verdict {
	if m.UsualWith != nil {
		return m.UsualWith(f)
	}
	return m.Usual
}

// ReplicationDecides is the usual verdict of a design whose keys are in
// PostgreSQL when PostgreSQL fails over: it holds only if the standby had
// every commit before it was acknowledged.
func ReplicationDecides(f lab.Faults) lab.Verdict {
	if f.Replication == lab.ReplicationSync {
		return lab.Holds
	}
	return lab.Breaks
}

// RelayReplaysCapture is the mechanism of applied_response_lost on a
// design whose effects leave through the outbox: the request never calls
// the provider, and the relay's redelivery is a replay there.
func RelayReplaysCapture() Mechanism {
	return Mechanism{Usual: lab.Holds,
		Holds:  "the request committed the charge and its event and answered; the relay's first capture was applied and its answer lost, so it delivered again under the same derived key, which the provider replayed: one charge, one capture",
		Breaks: "a second charge or capture got in"}
}

// nearestCrash is the mechanism of crash_after_phase on a design without
// phases, which crashes at its nearest point: after its claim for phase
// one, after its charge for phases two and three. False when the design
// explains neither.
func nearestCrash(ms map[Case]Mechanism) (Mechanism, bool) {
	claim, ok1 := ms[FaultCase(lab.FaultCrashAfterClaim)]
	charge, ok2 := ms[FaultCase(lab.FaultCrashAfterCharge)]
	if !ok1 || !ok2 {
		return Mechanism{}, false
	}
	which := func(f lab.Faults) Mechanism {
		if f.Phase == 1 {
			return claim
		}
		return charge
	}
	text := func(pick func(Mechanism) string) string {
		return "without phases, phase 1 is its crash after the claim (" + pick(claim) + "), and phases 2 and 3 its crash after the charge, its provider reached later through the outbox (" + pick(charge) + ")"
	}
	return Mechanism{Usual: charge.Usual, UsualWith: func(f lab.Faults) lab.Verdict { return which(f).Expected(f) },
		Holds: text(func(m Mechanism) string { return m.Holds }), Breaks: text(func(m Mechanism) string { return m.Breaks })}, true
}

// CrashEffect is what a crash of the process leaves of a design's keys: the
// one fact about a crash that the conformance suite's model of the design
// cannot read from its verdicts.
type CrashEffect string

// Crash effects a design may declare.
const (
	// CrashNothingToLose: the design keeps no keys (unsafe).
	CrashNothingToLose CrashEffect = "nothing to lose"
	// CrashWipesHeap: the keys live in the process heap and die with it:
	// every key of the crashing namespace is gone (memory, look-first).
	CrashWipesHeap CrashEffect = "heap wiped"
	// CrashLeavesClaim: the claim stays behind until its TTL, and the
	// completed record is never written (redis).
	CrashLeavesClaim CrashEffect = "claim stays until its TTL"
	// CrashRollsBack: the open transaction rolls back, claim included;
	// what committed stays (postgres, redis+postgres).
	CrashRollsBack CrashEffect = "transaction rolls back"
	// CrashLeavesLease: a committed claim stays until its lease ends; what
	// the second phase committed (charge and response together) stays
	// (lease).
	CrashLeavesLease CrashEffect = "lease stays until it ends"
	// CrashLeavesRecoveryPoint: every phase committed stays, with the key's
	// recovery point, locked until its lock ends; then a retry (or the
	// completer) resumes from there (phases).
	CrashLeavesRecoveryPoint CrashEffect = "recovery point stays; a retry resumes"
)

// keeps reports an effect a design that keeps keys may declare.
func (e CrashEffect) keeps() bool {
	switch e {
	case CrashWipesHeap, CrashLeavesClaim, CrashRollsBack, CrashLeavesLease, CrashLeavesRecoveryPoint:
		return true
	}
	return false
}

// Variant declares one idempotency design.
type Variant struct {
	Name    lab.StoreName
	Label   string // a few words for controls: "map in the heap"
	Decides string // one line: how it tells a first request from a retry
	Keys    string // where its keys live
	// RequiresKey is false for a design that ignores the Idempotency-Key:
	// POST /charges then accepts requests without one.
	RequiresKey bool
	// Effects is how the design's side effects leave: "outbox" or "direct".
	Effects string
	// Lifetime names what bounds a claim in time, when something does:
	// "claim TTL" (a lock that expires) or "lease" (renewed while its worker
	// lives). Runs draw it as a bar beside the claim; "" for none.
	Lifetime string
	// Crash is what a crash leaves of the design's keys; a keyed design
	// must declare it.
	Crash CrashEffect
	Needs []Need
	// HowToEnable tells an operator what to set when a need is missing.
	HowToEnable string
	// Mechanisms explain the design's outcome in each case; a case without
	// one is run and judged, with no explanation.
	Mechanisms map[Case]Mechanism
	// Open builds one replica's store from the services the assembly has.
	Open func(ctx context.Context, d Deps) (lab.Store, error)
}

// Deps are what a variant may build its store from. Services a variant
// does not declare in Needs may be nil.
type Deps struct {
	Ledger lab.Ledger
	Sender lab.DirectSender
	// Capturer captures a charge at the provider in the middle of a
	// request, for a design whose provider call is part of it.
	Capturer lab.Capturer
	Clock    lab.Clock
	Logger   *slog.Logger

	Window   time.Duration // retention of completed keys
	Wait     time.Duration // bounded wait for an in-flight twin
	ClaimTTL time.Duration // lifetime of a lock-style claim

	Redis       *goredis.Client // this replica's own client
	RedisPrefix string          // every Redis key the lab writes starts with it
	RedisWhere  string          // how Redis is reached, for descriptions
	// RedisPair is a client of the lab's primary and replica pair, always
	// on the current primary: where the failover fault happens. Nil when
	// the pair is not running (no redis-server installed, or turned off).
	RedisPair *goredis.Client

	// Postgres is this replica's own pool (search_path is the lab's schema),
	// shared by every store on it under one connection budget per namespace.
	Postgres *pgdb.Pool
	// AppName is the application_name of every session of this lab, so a
	// restart fault can find them; ResetPools drops every pool's dead
	// connections after such a restart.
	AppName    string
	ResetPools func()
}

// Has reports whether d provides need.
func (d Deps) Has(need Need) bool {
	switch need {
	case NeedRedis:
		return d.Redis != nil
	case NeedPostgres:
		return d.Postgres != nil
	}
	return false
}

// Registry is the ordered, immutable set of variants a lab offers.
type Registry struct {
	list   []Variant
	byName map[lab.StoreName]int
}

var validName = regexp.MustCompile(`^[a-z][a-z0-9+_-]{0,31}$`)

// NewRegistry checks and orders vs as given: names unique and URL-safe,
// Open set, known needs, a keyed design's crash effect declared, usual
// verdicts valid. A design silent on crash_after_phase gets the mechanism
// of its nearest crash.
func NewRegistry(vs ...Variant) (*Registry, error) {
	r := &Registry{byName: map[lab.StoreName]int{}}
	var errs []error
	for _, v := range vs {
		switch {
		case !validName.MatchString(string(v.Name)):
			errs = append(errs, fmt.Errorf("variant name %q: lower-case letters, digits, +, _ and -, at most 32", v.Name))
		case v.Open == nil:
			errs = append(errs, fmt.Errorf("variant %s: Open is nil", v.Name))
		case v.Effects != "outbox" && v.Effects != "direct":
			errs = append(errs, fmt.Errorf("variant %s: Effects must be outbox or direct (got %q)", v.Name, v.Effects))
		case v.RequiresKey && !v.Crash.keeps():
			errs = append(errs, fmt.Errorf("variant %s: a keyed design declares what a crash leaves of its keys: Crash must be %q, %q, %q, %q or %q (got %q)",
				v.Name, CrashWipesHeap, CrashLeavesClaim, CrashRollsBack, CrashLeavesLease, CrashLeavesRecoveryPoint, v.Crash))
		case !v.RequiresKey && v.Crash != "" && v.Crash != CrashNothingToLose:
			errs = append(errs, fmt.Errorf("variant %s: a design without keys has nothing a crash could leave: Crash must be %q or empty (got %q)",
				v.Name, CrashNothingToLose, v.Crash))
		}
		if _, dup := r.byName[v.Name]; dup {
			errs = append(errs, fmt.Errorf("variant %s registered twice", v.Name))
		}
		for _, n := range v.Needs {
			if n != NeedRedis && n != NeedPostgres {
				errs = append(errs, fmt.Errorf("variant %s: unknown need %q", v.Name, n))
			}
		}
		for c, m := range v.Mechanisms {
			if m.Usual != lab.Holds && m.Usual != lab.Breaks {
				errs = append(errs, fmt.Errorf("variant %s, case %s: usual verdict must be holds or breaks (got %q)", v.Name, c, m.Usual))
			}
		}
		if _, ok := v.Mechanisms[FaultCase(lab.FaultCrashAfterPhase)]; !ok {
			if m, ok := nearestCrash(v.Mechanisms); ok {
				v.Mechanisms = maps.Clone(v.Mechanisms)
				v.Mechanisms[FaultCase(lab.FaultCrashAfterPhase)] = m
			}
		}
		r.byName[v.Name] = len(r.list)
		r.list = append(r.list, v)
	}
	if len(r.list) == 0 {
		errs = append(errs, errors.New("no variants registered"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("error building the variant registry: %w", err)
	}
	return r, nil
}

// All lists the variants in presentation order.
func (r *Registry) All() []Variant { return append([]Variant(nil), r.list...) }

// Names lists the variants' names in presentation order.
func (r *Registry) Names() []lab.StoreName {
	out := make([]lab.StoreName, len(r.list))
	for i, v := range r.list {
		out[i] = v.Name
	}
	return out
}

// Get finds a variant by name.
func (r *Registry) Get(name lab.StoreName) (Variant, bool) {
	i, ok := r.byName[name]
	if !ok {
		return Variant{}, false
	}
	return r.list[i], true
}

// Mechanism finds the explanation of (name, c).
func (r *Registry) Mechanism(name lab.StoreName, c Case) (Mechanism, bool) {
	v, ok := r.Get(name)
	if !ok {
		return Mechanism{}, false
	}
	m, ok := v.Mechanisms[c]
	return m, ok
}
