package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// FaultPoint names a point on the charge path where a failure is injected.
type FaultPoint string

// Fault points on the charge path.
const (
	FaultNone             FaultPoint = ""
	FaultSlow             FaultPoint = "slow"               // the work between claim and completion takes work_ms
	FaultCrashAfterClaim  FaultPoint = "crash_after_claim"  // die after claiming the key, before charging
	FaultCrashAfterCharge FaultPoint = "crash_after_charge" // die after the ledger commit, before the response is stored or sent
	FaultOutboxFail       FaultPoint = "outbox_fail"        // writing the outbox event fails
	FaultStoreRestart     FaultPoint = "store_restart"      // the store loses its volatile state between retries
	FaultExpired          FaultPoint = "expired"            // the retry arrives after the retention window
	// FaultStaleWorker pauses the first worker past its claim's lifetime (a
	// GC pause, a partition); a retry takes over, then the first wakes up
	// and writes.
	FaultStaleWorker FaultPoint = "stale_worker"
	// FaultFailover promotes the Redis replica after the first attempt
	// wrote to the primary, while replication was held back: what the
	// primary acknowledged is gone, and the retries reach the new primary.
	FaultFailover FaultPoint = "failover"
	// FaultPGFailover promotes the PostgreSQL standby after the first
	// attempt committed on the primary, while the standby received no WAL:
	// under asynchronous replication what the primary acknowledged is gone;
	// under synchronous replication its commit waits and is never
	// acknowledged.
	FaultPGFailover FaultPoint = "pg_failover"
	// FaultCrashAfterPhase kills the process right after the atomic phase
	// Faults.Phase committed (crash_after_phase=1..3): on the phases design
	// after the claim, the charge, or the provider's capture. A design
	// without phases crashes at its nearest point: after its claim for
	// phase 1, after its charge for phases 2 and 3 (its provider call, if it
	// makes one, comes later, through the outbox).
	FaultCrashAfterPhase FaultPoint = "crash_after_phase"
	// FaultAppliedResponseLost makes the provider apply the first attempt's
	// capture and lose its answer: the caller cannot tell whether it
	// happened.
	FaultAppliedResponseLost FaultPoint = "applied_response_lost"
)

// Phases a crash_after_phase fault may name, and the one it names bare.
const (
	MaxCrashPhase     = 3
	DefaultCrashPhase = 2
)

// Replication is how the lab's PostgreSQL pair replicates: a primary that
// acknowledges a commit at once (async, PostgreSQL's default), or once its
// standby has it too (sync, the standby named in synchronous_standby_names).
type Replication string

// The pair's replication modes.
const (
	ReplicationAsync Replication = "async"
	ReplicationSync  Replication = "sync"
)

// FaultSpec describes a fault for the index and the page's controls.
type FaultSpec struct {
	Point  FaultPoint `json:"name"`
	Title  string     `json:"title"`
	Params []string   `json:"params"` // the run parameters that apply to it
	// Defaults are the values a run takes for those parameters when none is
	// given (the lab routes' defaults), so a page can show them.
	Defaults map[string]int `json:"defaults,omitempty"`
	// Choices are the values of a parameter that takes a word, the default
	// first.
	Choices map[string][]string `json:"choices,omitempty"`
}

// FaultSpecs lists every fault in presentation order, with the run parameters
// each one takes.
func FaultSpecs() []FaultSpec {
	replication := map[string][]string{"replication": {string(ReplicationAsync), string(ReplicationSync)}}
	return []FaultSpec{
		{FaultSlow, "the work between claim and completion is slow", []string{"work_ms", "ttl_ms"}, map[string]int{"work_ms": 300, "ttl_ms": 1000}, nil},
		{FaultCrashAfterClaim, "crash after the claim, before the charge", []string{"ttl_ms"}, map[string]int{"ttl_ms": 1000}, nil},
		{FaultCrashAfterCharge, "crash after the charge (lost response)", []string{"ttl_ms"}, map[string]int{"ttl_ms": 1000}, nil},
		{FaultOutboxFail, "the outbox write fails", []string{"ttl_ms"}, map[string]int{"ttl_ms": 1000}, nil},
		{FaultStoreRestart, "the store restarts between charge and retry", nil, nil, nil},
		{FaultExpired, "the retry arrives after the retention window", []string{"window_ms"}, map[string]int{"window_ms": 200}, nil},
		{FaultStaleWorker, "a worker pauses past its lease, a retry takes over, then it writes", []string{"work_ms", "ttl_ms"},
			map[string]int{"work_ms": 2000, "ttl_ms": 200}, nil},
		{FaultFailover, "Redis fails over before the claim replicated", nil, nil, nil},
		{FaultPGFailover, "PostgreSQL fails over before the commit replicated (replication async or sync)", []string{"replication"}, nil, replication},
		{FaultCrashAfterPhase, "crash after atomic phase 1, 2 or 3 (claim, charge, provider call)", []string{"phase", "ttl_ms"},
			map[string]int{"phase": DefaultCrashPhase, "ttl_ms": 1000}, nil},
		{FaultAppliedResponseLost, "the provider applies the first capture and its answer is lost", []string{"ttl_ms"}, map[string]int{"ttl_ms": 1000}, nil},
	}
}

// FaultDefault is the value a run of point takes for param when none is
// given (0 when the fault takes no such parameter).
func FaultDefault(point FaultPoint, param string) int64 {
	for _, f := range FaultSpecs() {
		if f.Point == point {
			return int64(f.Defaults[param])
		}
	}
	return 0
}

// FaultChoices are the values point's param takes, its default first.
func FaultChoices(point FaultPoint, param string) []string {
	for _, f := range FaultSpecs() {
		if f.Point == point {
			return f.Choices[param]
		}
	}
	return nil
}

// ParseFaultPoint accepts the name of a known fault.
func ParseFaultPoint(param, name string) (FaultPoint, error) {
	names := make([]string, 0, 6)
	for _, f := range FaultSpecs() {
		if string(f.Point) == name {
			return f.Point, nil
		}
		names = append(names, string(f.Point))
	}
	return "", Invalid(param, "unknown fault %q; allowed: %s", name, strings.Join(names, ", "))
}

// FaultHeader carries per-request faults: "slow; work_ms=300; ttl_ms=100".
const FaultHeader = "Lab-Fault"

// Faults is what one request asks the charge path to suffer, plus the store
// parameters the lessons need (claim TTL, retention window).
type Faults struct {
	Point FaultPoint
	// Phase is the atomic phase after which crash_after_phase crashes.
	Phase     int
	Work      time.Duration // slow: duration of the work
	ClaimTTL  time.Duration // redis claim TTL override
	Retention time.Duration // key retention override (expired)
	// OnPair sends the attempt's Redis commands to the lab's primary and
	// replica pair, where a failover can happen (redis=pair).
	OnPair bool
	// Replication, when set, sends the attempt to the lab's PostgreSQL
	// primary and standby, replicating that way (replication=async|sync):
	// where the pg_failover fault happens, far from the lab's own database.
	Replication Replication
	// RandomCaptureKey makes the charge's capture at the provider use a new
	// random key per delivery attempt instead of one derived from the
	// charge: the effect-side mistake (capture_key=random).
	RandomCaptureKey bool
	// Confine, when set, limits what a crash forgets to the namespace's
	// keys that start with it (confine=<prefix>): a matrix cell's crash
	// then leaves the caller's own keys alone.
	Confine string
}

// RetentionOr is the key retention this request asks for, or window.
func (f Faults) RetentionOr(window time.Duration) time.Duration {
	if f.Retention > 0 {
		return f.Retention
	}
	return window
}

// Has reports whether the named fault point is armed. A crash after a
// phase arms, for designs without phases, the crash nearest to it.
func (f Faults) Has(point FaultPoint) bool {
	switch {
	case point == FaultNone:
		return false
	case f.Point == FaultCrashAfterPhase && point == FaultCrashAfterClaim:
		return f.Phase == 1
	case f.Point == FaultCrashAfterPhase && point == FaultCrashAfterCharge:
		return f.Phase > 1
	}
	return f.Point == point
}

// String renders f in header form.
func (f Faults) String() string {
	var parts []string
	switch {
	case f.Point == FaultCrashAfterPhase:
		parts = append(parts, string(f.Point)+"="+strconv.Itoa(f.Phase))
	case f.Point != "":
		parts = append(parts, string(f.Point))
	}
	if f.Work > 0 {
		parts = append(parts, "work_ms="+strconv.FormatInt(f.Work.Milliseconds(), 10))
	}
	if f.ClaimTTL > 0 {
		parts = append(parts, "ttl_ms="+strconv.FormatInt(f.ClaimTTL.Milliseconds(), 10))
	}
	if f.Retention > 0 {
		parts = append(parts, "window_ms="+strconv.FormatInt(f.Retention.Milliseconds(), 10))
	}
	if f.RandomCaptureKey {
		parts = append(parts, "capture_key="+CaptureKeyRandom)
	}
	if f.OnPair {
		parts = append(parts, "redis=pair")
	}
	if f.Replication != "" {
		parts = append(parts, "replication="+string(f.Replication))
	}
	if f.Confine != "" {
		parts = append(parts, "confine="+f.Confine)
	}
	return strings.Join(parts, "; ")
}

// ParseFaults reads the Lab-Fault header.
func ParseFaults(h string) (Faults, error) {
	var f Faults
	seen := map[string]bool{}
	for part := range strings.SplitSeq(h, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, value, isParam := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		if !isParam || name == string(FaultCrashAfterPhase) {
			name = "fault point"
		}
		if seen[name] {
			return f, Invalid(FaultHeader, "gives the %s twice", strconv.Quote(name))
		}
		seen[name] = true
		if !isParam {
			point, err := ParseFaultPoint(FaultHeader, part)
			if err != nil {
				return f, err
			}
			f.Point = point
			if point == FaultCrashAfterPhase {
				f.Phase = DefaultCrashPhase
			}
			continue
		}
		if point, phase, ok := strings.Cut(part, "="); ok && strings.TrimSpace(point) == string(FaultCrashAfterPhase) {
			n, err := strconv.Atoi(strings.TrimSpace(phase))
			if err != nil || n < 1 || n > MaxCrashPhase {
				return f, Invalid(FaultHeader, "crash_after_phase must be 1, 2 or 3 (got %q)", phase)
			}
			f.Point, f.Phase = FaultCrashAfterPhase, n
			continue
		}
		if name == "redis" {
			if strings.TrimSpace(value) != "pair" {
				return f, Invalid(FaultHeader, "redis must be pair (got %q)", value)
			}
			f.OnPair = true
			continue
		}
		if name == "replication" {
			switch r := Replication(strings.TrimSpace(value)); r {
			case ReplicationAsync, ReplicationSync:
				f.Replication = r
			default:
				return f, Invalid(FaultHeader, "replication must be async or sync (got %q)", value)
			}
			continue
		}
		if name == "capture_key" {
			switch strings.TrimSpace(value) {
			case CaptureKeyRandom:
				f.RandomCaptureKey = true
			case CaptureKeyDerived:
			default:
				return f, Invalid(FaultHeader, "capture_key must be derived or random (got %q)", value)
			}
			continue
		}
		if name == "confine" {
			prefix := strings.TrimSpace(value)
			if err := CheckKeyPrefix(prefix); err != nil {
				return f, Invalid(FaultHeader, "confine: %v", err)
			}
			f.Confine = prefix
			continue
		}
		var dst *time.Duration
		switch name {
		case "work_ms":
			dst = &f.Work
		case "ttl_ms":
			dst = &f.ClaimTTL
		case "window_ms":
			dst = &f.Retention
		default:
			return f, Invalid(FaultHeader, "unknown parameter %q; allowed: work_ms, ttl_ms, window_ms, capture_key, redis, replication, confine, crash_after_phase", name)
		}
		// Canonical decimal only, as in a query: no sign, space or leading zero.
		ms, err := strconv.ParseInt(value, 10, 64)
		if err != nil || strconv.FormatInt(ms, 10) != value || ms < 1 || ms > 60_000 {
			return f, Invalid(FaultHeader, "%s must be an integer in 1..60000 (got %q)", name, value)
		}
		*dst = time.Duration(ms) * time.Millisecond
	}
	if f.Has(FaultFailover) {
		f.OnPair = true // a failover happens on the pair
	}
	if f.Has(FaultPGFailover) && f.Replication == "" {
		f.Replication = ReplicationAsync // PostgreSQL's default
	}
	if f.Pauses() && f.Work == 0 {
		return f, Invalid(FaultHeader, "%s needs work_ms in 1..60000", f.Point)
	}
	return f, nil
}

// Region is what a restart or a crash forgets: a namespace's keys (every
// namespace's with ""), or only those of its keys that start with
// KeyPrefix, so that the matrix's cells forget their own keys and never
// the caller's.
type Region struct {
	Namespace Namespace
	KeyPrefix string
}

// Covers reports whether the region holds the scope's key.
func (r Region) Covers(sc Scope) bool {
	return r.Namespace.Includes(sc.Namespace) && strings.HasPrefix(sc.Key, r.KeyPrefix)
}

// CrashRegion is what a crash of attempt a forgets on a store that keeps
// its keys in the process: its namespace's, or the confined part of it.
func CrashRegion(a Attempt) Region {
	return Region{Namespace: a.Scope.Namespace, KeyPrefix: a.Faults.Confine}
}

// MaxKeyPrefixBytes bounds a confining key prefix.
const MaxKeyPrefixBytes = 64

// CheckKeyPrefix accepts a key prefix that confines a restart or a crash:
// 1..64 letters, digits, '-', '_' or '.', so it is safe in the Lab-Fault
// header and in a Redis SCAN pattern alike.
func CheckKeyPrefix(prefix string) error {
	if prefix == "" || len(prefix) > MaxKeyPrefixBytes {
		return fmt.Errorf("a key prefix has 1..%d characters (got %d)", MaxKeyPrefixBytes, len(prefix))
	}
	for _, r := range prefix {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("a key prefix holds letters, digits, '-', '_' and '.' only (got %q)", prefix)
		}
	}
	return nil
}

// Pauses reports faults that pause the worker between its claim and its
// write for Work.
func (f Faults) Pauses() bool { return f.Has(FaultSlow) || f.Has(FaultStaleWorker) }

// Fence reports faults that make a fence refuse a worker's write: a stale
// worker's pause, or a lease they shortened (ttl_ms), which a retry's
// write on a loaded machine can outlive. Such a refusal is the lesson,
// not an incident.
func (f Faults) Fence() bool { return f.Has(FaultStaleWorker) || f.ClaimTTL > 0 }

// Pause sleeps for the slow or stale worker's pause, or until ctx ends.
func (f Faults) Pause(ctx context.Context) error {
	if !f.Pauses() {
		return nil
	}
	if err := Sleep(ctx, f.Work); err != nil {
		return fmt.Errorf("%s pause interrupted: %w", f.Point, err)
	}
	Mark(ctx, PhaseWork)
	return nil
}

// Sleep waits for d, or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// MarshalJSON renders the faults in header form.
func (f Faults) MarshalJSON() ([]byte, error) { return []byte(strconv.Quote(f.String())), nil }

// UnmarshalJSON reads the header form MarshalJSON writes, so reports and
// matrices decode into their types.
func (f *Faults) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("faults must be a JSON string in Lab-Fault form: %w", err)
	}
	parsed, err := ParseFaults(s)
	if err != nil {
		return err
	}
	*f = parsed
	return nil
}
