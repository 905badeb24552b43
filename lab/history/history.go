// Package history is a run's history — every try of every attempt as an
// operation (when it was called, when it returned, what it asked, what it
// was told), the reads of the ledger made during and after the run, and the
// fault events — and the check that proves it: is there one order of those
// operations, each taking effect at one instant between its call and its
// return, in which a single, atomic "charge once per key" gives every
// answer seen? That is linearizability, checked with porcupine.
//
// The model, per key (tenant, endpoint, key):
//   - a key is charged at most once;
//   - every success (201, replayed or not) returns that one charge;
//   - the same key with another fingerprint never charges (422);
//   - a 409 and the lab's 4xx apply nothing;
//   - an answer that never came (a dropped connection, a timeout), a 5xx or
//     a 202 may or may not have applied the charge;
//   - a read of the ledger returns exactly the charges applied.
//
// A client's answers alone cannot see every break: a key charged twice may
// answer every retry with the same (second) charge. The ledger reads can.
package history

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
)

// Kind is what an operation does.
type Kind string

// Kinds of operations.
const (
	Charge     Kind = "charge"      // one try of an attempt: a POST of the charge, or a poll of its operation
	LedgerRead Kind = "ledger_read" // a read of the charges the ledger holds for the key
)

// Key names one key of the charge API: the history's partition.
type Key struct {
	Tenant   string `json:"tenant"`
	Endpoint string `json:"endpoint"`
	Key      string `json:"key"`
}

// Op is one operation, with its times in microseconds on the run's one
// time axis (from its first release).
type Op struct {
	Kind Kind `json:"kind"`
	// Client is the attempt (1, 2, …) a try belongs to; 0 for a ledger read.
	Client int `json:"client"`
	// Before marks a ledger read made before the run's first call: what the
	// key held before the run, which no operation of the run explains.
	Before   bool  `json:"before,omitempty"`
	CallUS   int64 `json:"call_us"`
	ReturnUS int64 `json:"return_us"`
	Key      Key   `json:"key"`
	// Input of a charge: the request's fingerprint.
	Fingerprint string `json:"fingerprint,omitempty"`
	// Output of a charge: the status (0 when no answer came), the charge id
	// of a 2xx body, and whether it was a replay.
	Status   int    `json:"status,omitempty"`
	ChargeID string `json:"charge_id,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
	Code     string `json:"code,omitempty"` // a problem's code
	// Output of a ledger read: the charge ids the ledger holds for the key.
	Charges []string `json:"charges,omitempty"`
}

// Unknown reports a charge whose answer says nothing of its outcome: no
// answer, a 5xx, or a 202 (the operation still running). It may or may not
// have applied.
func (o Op) Unknown() bool {
	return o.Kind == Charge && (o.Status == 0 || o.Status >= 500 || o.Status == http.StatusAccepted)
}

// success reports a charge answered with its outcome: a 2xx but 202.
func (o Op) success() bool {
	return o.Kind == Charge && o.Status >= 200 && o.Status < 300 && o.Status != http.StatusAccepted
}

// Event is a fault event of the run, shown beside the operations.
type Event struct {
	Name   string `json:"name"`
	AtUS   int64  `json:"at_us"`
	Client int    `json:"client,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// History is one run's operations and events.
type History struct {
	Run    string  `json:"run"`
	Ops    []Op    `json:"ops"`
	Events []Event `json:"events,omitempty"`
}

// Line is one line of a history as NDJSON: a header ({"run": …}), then an
// operation ({"op": …}) or an event ({"event": …}) per line.
type Line struct {
	Run   string `json:"run,omitempty"`
	Op    *Op    `json:"op,omitempty"`
	Event *Event `json:"event,omitempty"`
}

// WriteNDJSON writes h one line at a time: the run, then each operation,
// then each event.
func (h History) WriteNDJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	if err := enc.Encode(Line{Run: h.Run}); err != nil {
		return fmt.Errorf("error writing the history: %w", err)
	}
	for i := range h.Ops {
		if err := enc.Encode(Line{Op: &h.Ops[i]}); err != nil {
			return fmt.Errorf("error writing the history: %w", err)
		}
	}
	for i := range h.Events {
		if err := enc.Encode(Line{Event: &h.Events[i]}); err != nil {
			return fmt.Errorf("error writing the history: %w", err)
		}
	}
	return nil
}

// MaxOps bounds a history read from outside: far more than a run has.
const MaxOps = 100_000

// ReadNDJSON reads a history written by WriteNDJSON (or by hand, in that
// format), refusing what it cannot check: an unknown field or kind, a
// return before its call, an operation without a key.
func ReadNDJSON(r io.Reader) (History, error) {
	var h History
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var l Line
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return h, fmt.Errorf("line %d: %w", n, err)
		}
		switch {
		case l.Op != nil:
			if err := l.Op.check(); err != nil {
				return h, fmt.Errorf("line %d: %w", n, err)
			}
			if len(h.Ops) == MaxOps {
				return h, fmt.Errorf("line %d: more than %d operations", n, MaxOps)
			}
			h.Ops = append(h.Ops, *l.Op)
		case l.Event != nil:
			h.Events = append(h.Events, *l.Event)
		case l.Run != "":
			h.Run = l.Run
		default:
			return h, fmt.Errorf("line %d: neither a run, an op nor an event", n)
		}
	}
	if err := sc.Err(); err != nil {
		return h, fmt.Errorf("error reading the history: %w", err)
	}
	if len(h.Ops) == 0 {
		return h, errors.New("the history holds no operation")
	}
	return h, nil
}

func (o Op) check() error {
	switch {
	case o.Kind != Charge && o.Kind != LedgerRead:
		return fmt.Errorf("op kind must be %s or %s (got %q)", Charge, LedgerRead, o.Kind)
	case o.ReturnUS < o.CallUS:
		return fmt.Errorf("op returns (%d µs) before its call (%d µs)", o.ReturnUS, o.CallUS)
	case o.Key.Key == "":
		return errors.New("op has no key")
	case o.Kind == Charge && o.Status != 0 && (o.Status < 100 || o.Status > 599):
		return fmt.Errorf("op status %d is no HTTP status", o.Status)
	}
	return nil
}

// Keys lists the keys of h, in the order they first appear.
func (h History) Keys() []Key {
	var keys []Key
	for _, o := range h.Ops {
		if !slices.Contains(keys, o.Key) {
			keys = append(keys, o.Key)
		}
	}
	return keys
}
