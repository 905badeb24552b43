package lab

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Phase names a step of an attempt on the server, in the order a first
// attempt passes them. A replay passes only PhaseReplay.
const (
	PhaseClaim  = "claim"  // the store decided this attempt is the first
	PhaseWork   = "work"   // the injected slow work ended
	PhaseCharge = "charge" // the ledger holds the charge (not yet committed where the design holds a transaction)
	PhaseCommit = "commit" // the response is stored: later retries replay it
	PhaseReplay = "replay" // the store answered with a stored response
)

// Phases records when one attempt passed each phase, for the Server-Timing
// header the lab's runner draws on the lanes. The zero value is not usable;
// NewPhases starts the clock.
type Phases struct {
	start time.Time
	mu    sync.Mutex
	marks []phaseMark
}

type phaseMark struct {
	name string
	at   time.Duration
}

// NewPhases starts recording at start (the request's arrival).
func NewPhases(start time.Time) *Phases { return &Phases{start: start} }

type phasesKey struct{}

// WithPhases makes Mark on ctx (and contexts derived from it) record into p.
func WithPhases(ctx context.Context, p *Phases) context.Context {
	return context.WithValue(ctx, phasesKey{}, p)
}

// Mark records that the attempt behind ctx passed phase name now; without a
// recorder it does nothing.
func Mark(ctx context.Context, name string) {
	p, _ := ctx.Value(phasesKey{}).(*Phases)
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marks = append(p.marks, phaseMark{name, time.Since(p.start)})
}

// ServerTiming renders the phases as a Server-Timing header value: each
// phase's duration since the previous one (or the request's arrival), so
// the running sum is when it ended. Empty when nothing was marked.
func (p *Phases) ServerTiming() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	var prev time.Duration
	for i, m := range p.marks {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(m.name)
		b.WriteString(";dur=")
		b.WriteString(strconv.FormatFloat(float64(m.at-prev)/float64(time.Millisecond), 'f', 3, 64))
		prev = m.at
	}
	return b.String()
}

// PhaseAt is a phase's end, in milliseconds after the request's arrival.
type PhaseAt struct {
	Name string  `json:"name"`
	AtMS float64 `json:"at_ms"`
}

// ParseServerTiming reads a Server-Timing value written by ServerTiming
// back into each phase's end. Entries without a duration, or with one that
// is not a number, are skipped.
func ParseServerTiming(v string) []PhaseAt {
	var out []PhaseAt
	var sum float64
	for entry := range strings.SplitSeq(v, ",") {
		parts := strings.Split(entry, ";")
		name := strings.TrimSpace(parts[0])
		for _, param := range parts[1:] {
			k, val, ok := strings.Cut(strings.TrimSpace(param), "=")
			if !ok || k != "dur" {
				continue
			}
			d, err := strconv.ParseFloat(val, 64)
			if err != nil || d < 0 {
				break
			}
			sum += d
			out = append(out, PhaseAt{Name: name, AtMS: sum})
			break
		}
	}
	return out
}
