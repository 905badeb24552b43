package step

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/idempotency-lab/lab/lab"
)

// Move is one step of a schedule: an attempt moved to its next point, or a
// time-driven event made to happen (Attempt 0).
type Move struct {
	Attempt int
	Event   lab.TimeEvent
}

// A attempt's move.
func A(n int) Move { return Move{Attempt: n} }

// E an event's move.
func E(e lab.TimeEvent) Move { return Move{Event: e} }

// String is the move as a schedule writes it: "2" or "ttl".
func (m Move) String() string {
	if m.Event != "" {
		return string(m.Event)
	}
	return strconv.Itoa(m.Attempt)
}

// MarshalJSON writes an attempt's move as its number, an event's as its name.
func (m Move) MarshalJSON() ([]byte, error) {
	if m.Event != "" {
		return json.Marshal(string(m.Event))
	}
	return json.Marshal(m.Attempt)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (m *Move) UnmarshalJSON(b []byte) error {
	var n int
	if err := json.Unmarshal(b, &n); err == nil {
		*m = A(n)
		return nil
	}
	var e string
	if err := json.Unmarshal(b, &e); err != nil {
		return fmt.Errorf("a move is an attempt's number or an event's name: %w", err)
	}
	*m = E(lab.TimeEvent(e))
	return nil
}

// FormatMoves writes a schedule as ParseMoves reads it: "1,2,ttl,2".
func FormatMoves(moves []Move) string {
	parts := make([]string, len(moves))
	for i, m := range moves {
		parts[i] = m.String()
	}
	return strings.Join(parts, ",")
}

// ParseMoves reads a schedule such as "1,2,ttl,2" for a run of n attempts:
// attempts by number, time-driven events by name.
func ParseMoves(raw string, n int) ([]Move, error) {
	if raw == "" {
		return nil, lab.Invalid("schedule", "must list moves such as 1,2,1,2 (attempts) or 1,ttl,2 (with an event)")
	}
	parts := strings.Split(raw, ",")
	if len(parts) > MaxMoves {
		return nil, lab.Invalid("schedule", "must have at most %d moves (got %d)", MaxMoves, len(parts))
	}
	moves := make([]Move, 0, len(parts))
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if e, ok := findEvent(p); ok {
			moves = append(moves, E(e))
			continue
		}
		a, err := strconv.Atoi(p)
		if err != nil || a < 1 || a > n {
			return nil, lab.Invalid("schedule", "each move must be an attempt in 1..%d or an event (%s) (got %q)", n, eventNames(), p)
		}
		moves = append(moves, A(a))
	}
	return moves, nil
}

// ParseEvent reads one event's name.
func ParseEvent(param, raw string) (lab.TimeEvent, error) {
	if e, ok := findEvent(raw); ok {
		return e, nil
	}
	return "", lab.Invalid(param, "must be one of %s (got %q)", eventNames(), raw)
}

func findEvent(name string) (lab.TimeEvent, bool) {
	for _, e := range lab.TimeEvents() {
		if string(e.Event) == name {
			return e.Event, true
		}
	}
	return "", false
}

func eventNames() string {
	var names []string
	for _, e := range lab.TimeEvents() {
		names = append(names, string(e.Event))
	}
	return strings.Join(names, ", ")
}
