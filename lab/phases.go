package lab

import (
	"context"
	"slices"
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
	// PhaseRenew is a live worker renewing its lease while it works, so
	// that slow work is not taken over.
	PhaseRenew = "renew"
	// PhaseFenced is a write the ledger refused: the worker's fencing token
	// was no longer the key's (its detail says both tokens).
	PhaseFenced = "fenced"
	// PhaseResume is a retry taking over a key a crash or a failure left
	// short of its end: it runs from the key's recovery point (the detail
	// names it), not from the start.
	PhaseResume = "resume"
	// PhaseProvider is the provider's capture, made inline by a design
	// whose provider call is part of the request (the detail has its id).
	PhaseProvider = "provider"
)

// Phases records when one attempt passed each phase, for the Server-Timing
// header the lab's runner draws on the lanes. The zero value is not usable;
// NewPhases starts the clock.
type Phases struct {
	arrival time.Time
	mu      sync.Mutex
	marks   []phaseMark
}

type phaseMark struct {
	name   string
	detail string
	at     time.Time
}

// NewPhases starts recording at arrival (the request's arrival).
func NewPhases(arrival time.Time) *Phases { return &Phases{arrival: arrival} }

type phasesKey struct{}

// WithPhases makes Mark on ctx (and contexts derived from it) record into p.
func WithPhases(ctx context.Context, p *Phases) context.Context {
	return context.WithValue(ctx, phasesKey{}, p)
}

// Mark records that the attempt behind ctx passed phase name now; without a
// recorder it does nothing.
func Mark(ctx context.Context, name string) { MarkDetail(ctx, name, "") }

// MarkDetail is Mark with a few words on what happened there, such as the
// two tokens of a fenced write.
func MarkDetail(ctx context.Context, name, detail string) {
	if p, _ := ctx.Value(phasesKey{}).(*Phases); p != nil {
		p.add(phaseMark{name, detail, time.Now()})
	}
}

// MarkBefore takes the instant now and returns what records name at it. A
// write that makes the response visible to twins (a commit) is marked as
// it is sent and recorded once it succeeded: a twin reads the response
// only later, so its replay is never drawn before the commit.
func MarkBefore(ctx context.Context, name string) (record func()) {
	p, _ := ctx.Value(phasesKey{}).(*Phases)
	if p == nil {
		return func() {}
	}
	m := phaseMark{name: name, at: time.Now()}
	return func() { p.add(m) }
}

func (p *Phases) add(m phaseMark) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marks = append(p.marks, m)
}

// arrivalPhase names the request's arrival in Server-Timing: its desc is
// the instant, in Unix microseconds, on the wall clock the lab's runner
// shares with its servers, so the runner places every attempt's phases on
// one clock, however late a request reached its server.
const arrivalPhase = "arrival"

// ServerTiming renders the phases as a Server-Timing header value: the
// arrival's instant, then each phase's duration since the previous one
// (or the arrival), so the running sum is when it ended. Empty when
// nothing was marked.
func (p *Phases) ServerTiming() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.marks) == 0 {
		return ""
	}
	// In the order they happened: one marked before it was recorded may
	// have been recorded after a later one.
	slices.SortStableFunc(p.marks, func(a, b phaseMark) int { return a.at.Compare(b.at) })
	// Whole microseconds of the wall clock, so that the runner's sums are exact.
	prev := p.arrival.UnixMicro()
	var b strings.Builder
	b.WriteString(arrivalPhase + `;desc="` + strconv.FormatInt(prev, 10) + `"`)
	for _, m := range p.marks {
		at := m.at.UnixMicro()
		b.WriteString(", ")
		b.WriteString(m.name)
		b.WriteString(";dur=")
		b.WriteString(strconv.FormatFloat(float64(at-prev)/1000, 'f', 3, 64))
		if m.detail != "" {
			b.WriteString(";desc=")
			b.WriteString(strconv.Quote(m.detail))
		}
		prev = at
	}
	return b.String()
}

// PhaseAt is a phase's end, in milliseconds after the request's arrival.
type PhaseAt struct {
	Name   string  `json:"name"`
	AtMS   float64 `json:"at_ms"`
	Detail string  `json:"detail,omitempty"`
}

// ParseServerTiming reads a Server-Timing value written by ServerTiming
// back into the request's arrival (zero when the value has none) and each
// phase's end and detail. Entries without a duration, or with one that is
// not a number, are skipped.
func ParseServerTiming(v string) (arrival time.Time, phases []PhaseAt) {
	var sum float64
	for _, entry := range splitOutsideQuotes(v, ',') {
		parts := splitOutsideQuotes(entry, ';')
		p := PhaseAt{Name: strings.TrimSpace(parts[0])}
		dur := -1.0
		for _, param := range parts[1:] {
			k, val, ok := strings.Cut(strings.TrimSpace(param), "=")
			switch {
			case !ok:
			case k == "dur":
				if d, err := strconv.ParseFloat(val, 64); err == nil && d >= 0 {
					dur = d
				}
			case k == "desc":
				if unq, err := strconv.Unquote(val); err == nil {
					val = unq
				}
				p.Detail = val
			}
		}
		if us, err := strconv.ParseInt(p.Detail, 10, 64); p.Name == arrivalPhase && err == nil {
			arrival = time.UnixMicro(us)
		}
		if dur < 0 {
			continue
		}
		sum += dur
		p.AtMS = sum
		phases = append(phases, p)
	}
	return arrival, phases
}

// splitOutsideQuotes splits v at sep, except inside a quoted string (where
// a backslash escapes the next byte), as Server-Timing's desc may hold sep.
func splitOutsideQuotes(v string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			out = append(out, v[start:i])
			start = i + 1
		}
	}
	return append(out, v[start:])
}
