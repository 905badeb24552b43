package lab

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Fault points on the charge path.
const (
	FaultNone             = ""
	FaultSlow             = "slow"               // the work between claim and completion takes work_ms
	FaultCrashAfterClaim  = "crash_after_claim"  // die after claiming the key, before charging
	FaultCrashAfterCharge = "crash_after_charge" // die after the ledger commit, before the response is stored or sent
	FaultOutboxFail       = "outbox_fail"        // writing the outbox event fails
	FaultStoreRestart     = "store_restart"      // the store loses its volatile state between retries
	FaultExpired          = "expired"            // the retry arrives after the retention window
)

// FaultNames lists the faults in presentation order.
var FaultNames = []string{FaultSlow, FaultCrashAfterClaim, FaultCrashAfterCharge, FaultOutboxFail, FaultStoreRestart, FaultExpired}

// FaultHeader carries per-request faults: "slow; work_ms=300; ttl_ms=100".
const FaultHeader = "Lab-Fault"

// Faults is what one request asks the charge path to suffer, plus the store
// parameters the lessons need (claim TTL, retention window).
type Faults struct {
	Point     string
	Work      time.Duration // slow: duration of the work
	ClaimTTL  time.Duration // redis claim TTL override
	Retention time.Duration // key retention override (expired)
}

// RetentionOr is the key retention this request asks for, or window.
func (f Faults) RetentionOr(window time.Duration) time.Duration {
	if f.Retention > 0 {
		return f.Retention
	}
	return window
}

// Has reports whether the named fault point is armed.
func (f Faults) Has(point string) bool { return f.Point == point && point != "" }

// String renders f in header form.
func (f Faults) String() string {
	var parts []string
	if f.Point != "" {
		parts = append(parts, f.Point)
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
	return strings.Join(parts, "; ")
}

// ParseFaults reads the Lab-Fault header.
func ParseFaults(h string) (Faults, error) {
	var f Faults
	for part := range strings.SplitSeq(h, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, value, isParam := strings.Cut(part, "=")
		if !isParam {
			if !slices.Contains(FaultNames, part) {
				return f, Invalid(FaultHeader, "unknown fault %q; allowed: %s", part, strings.Join(FaultNames, ", "))
			}
			f.Point = part
			continue
		}
		ms, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		if err != nil || ms < 1 || ms > 60_000 {
			return f, Invalid(FaultHeader, "%s must be an integer in 1..60000", name)
		}
		d := time.Duration(ms) * time.Millisecond
		switch strings.TrimSpace(name) {
		case "work_ms":
			f.Work = d
		case "ttl_ms":
			f.ClaimTTL = d
		case "window_ms":
			f.Retention = d
		default:
			return f, Invalid(FaultHeader, "unknown parameter %q; allowed: work_ms, ttl_ms, window_ms", name)
		}
	}
	if f.Point == FaultSlow && f.Work == 0 {
		return f, Invalid(FaultHeader, "slow needs work_ms in 1..60000")
	}
	return f, nil
}

// Pause sleeps for the slow fault's work, or until ctx ends.
func (f Faults) Pause(done <-chan struct{}) error {
	if !f.Has(FaultSlow) {
		return nil
	}
	t := time.NewTimer(f.Work)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-done:
		return fmt.Errorf("slow work interrupted")
	}
}

// MarshalJSON renders the faults in header form.
func (f Faults) MarshalJSON() ([]byte, error) { return []byte(strconv.Quote(f.String())), nil }
