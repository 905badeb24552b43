package experiment

import (
	"fmt"
	"slices"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Event is something that happened during a run, on the run's one time
// axis: a claim's TTL or lease starting and running out, a pause, a crash,
// a restart, the retention window ending, a failover, a fenced write.
type Event struct {
	Name    string  `json:"name"`
	AtMS    float64 `json:"at_ms"`
	Attempt int     `json:"attempt,omitempty"` // the attempt it concerns, if one
	Detail  string  `json:"detail,omitempty"`
}

// Event names.
const (
	EventTTLStart        = "ttl_start"        // an attempt claimed the key: its claim's TTL (or lease) starts
	EventTTLEnd          = "ttl_end"          // that TTL or lease runs out, unless the claim settled first
	EventPauseStart      = "pause_start"      // the worker's pause (slow work, a stale worker) starts
	EventPauseEnd        = "pause_end"        // and ends
	EventCrash           = "crash"            // the server died under the attempt: no response
	EventStoreRestart    = "store_restart"    // the store lost its volatile state
	EventWindowExpired   = "window_expired"   // the key's retention window ended
	EventFailoverHold    = "failover_hold"    // replication to the Redis replica held back
	EventFailoverPromote = "failover_promote" // the replica promoted to primary
	EventRetriesReleased = "retries_released" // the retries left the barrier
	EventFenced          = "fenced"           // the ledger refused a stale worker's write
)

// events records the runner's own events as they happen, on the run's
// axis, and adds those read from the attempts' phases once they answered.
type events struct {
	origin time.Time
	list   []Event
}

func (e *events) add(name string, attempt int, detail string) {
	e.list = append(e.list, Event{Name: name, AtMS: ms(time.Since(e.origin)), Attempt: attempt, Detail: detail})
}

// lifetime is what bounds a store's claim ("" for nothing), and for how
// long in this run.
type lifetime struct {
	name string // "claim TTL" or "lease"
	ttl  time.Duration
}

// fromPhases reads the events the server's phases show: each claim's TTL
// or lease (renewed while a live worker works), each pause, each fenced
// write, each crash of the faulted attempt.
func (e *events) fromPhases(results []Result, life lifetime, spec Spec) {
	for _, res := range results {
		for _, t := range res.Tries {
			claimAt, renewedAt, settledAt := -1.0, -1.0, -1.0
			for _, p := range t.Phases {
				switch p.Name {
				case lab.PhaseClaim:
					claimAt = p.AtMS
					e.list = append(e.list, Event{Name: EventTTLStart, AtMS: p.AtMS, Attempt: res.Attempt, Detail: life.describe()})
				case lab.PhaseRenew:
					renewedAt = p.AtMS
				case lab.PhaseWork:
					if claimAt >= 0 {
						e.list = append(e.list, Event{Name: EventPauseStart, AtMS: claimAt, Attempt: res.Attempt, Detail: pauseDetail(spec.Faults)})
					}
					e.list = append(e.list, Event{Name: EventPauseEnd, AtMS: p.AtMS, Attempt: res.Attempt})
				case lab.PhaseFenced:
					e.list = append(e.list, Event{Name: EventFenced, AtMS: p.AtMS, Attempt: res.Attempt, Detail: p.Detail})
				case lab.PhaseCommit:
					settledAt = p.AtMS
				}
			}
			if claimAt >= 0 && life.name != "" {
				end, detail := claimAt+ms(life.ttl), life.name+" ran out"
				if renewedAt >= 0 {
					end, detail = renewedAt+ms(life.ttl), life.name+" ran out after its last renewal"
				}
				if settledAt >= 0 && settledAt < end {
					end, detail = settledAt, "the claim settled (its response stored) before its "+life.name+" ran out"
				}
				e.list = append(e.list, Event{Name: EventTTLEnd, AtMS: end, Attempt: res.Attempt, Detail: detail})
			}
			// No crash in a failover: its first client hung up on a commit that waited.
			if t.Status == 0 && res.Attempt == 1 && faultHitsFirstAttempt(spec) && spec.Faults.Point != lab.FaultOutboxFail && spec.Faults.Point != lab.FaultPGFailover {
				e.list = append(e.list, Event{Name: EventCrash, AtMS: t.StartMS + t.LatencyMS, Attempt: res.Attempt,
					Detail: fmt.Sprintf("the server died (%s): the connection closed without a response", spec.Faults.Point)})
			}
		}
	}
	if life.name == "" { // no TTL to draw: keep the claims' other events only
		e.list = slices.DeleteFunc(e.list, func(ev Event) bool { return ev.Name == EventTTLStart })
	}
	slices.SortStableFunc(e.list, func(a, b Event) int {
		switch {
		case a.AtMS < b.AtMS:
			return -1
		case a.AtMS > b.AtMS:
			return 1
		}
		return 0
	})
}

func (l lifetime) describe() string {
	if l.name == "" {
		return ""
	}
	return fmt.Sprintf("%s %d ms", l.name, l.ttl.Milliseconds())
}

func pauseDetail(f lab.Faults) string {
	if f.Has(lab.FaultStaleWorker) {
		return fmt.Sprintf("the worker stops for %d ms (a GC pause, a partition): it renews nothing", f.Work.Milliseconds())
	}
	return fmt.Sprintf("the work takes %d ms", f.Work.Milliseconds())
}
