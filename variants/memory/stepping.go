package memory

// What a stepped run reads and moves: which stepped attempt
// holds a claim, what the map holds for a key (lab.KeyInspector), and the
// time-driven moves the design has (lab.TimeMover).

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// where is where the store keeps a key, for a stepped run's view.
const where = "this replica's map"

// hold remembers which stepped attempt claimed e. Any other attempt costs
// one context lookup and nothing is kept.
func (s *Store) hold(ctx context.Context, e *entry) {
	name := lab.StepName(ctx)
	if name == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for old := range s.holders { // what the map no longer holds goes: a stepped run's keys are few
		if s.entries[old.scope] != old {
			delete(s.holders, old)
		}
	}
	if s.holders == nil {
		s.holders = map[*entry]string{}
	}
	s.holders[e] = name
}

// Inspect says what the map holds for the key.
func (s *Store) Inspect(_ context.Context, sc lab.Scope) (lab.KeyInspection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e := s.entries[sc]
	if e == nil {
		return held{}.inspection(now), nil
	}
	h := held{found: true, state: e.state, holder: s.holders[e], fingerprint: e.fingerprint, chargeID: e.chargeID,
		inherited: e.inherited, resp: e.resp, created: e.createdAt, expires: e.expiresAt}
	return h.inspection(now), nil
}

// TimeMoves are the events a memory key lives by.
func (s *Store) TimeMoves() []lab.TimeEvent { return []lab.TimeEvent{lab.EventWindow, lab.EventWait} }

// MakeHappen makes a time-driven event happen to the key now.
func (s *Store) MakeHappen(_ context.Context, sc lab.Scope, ev lab.TimeEvent) error {
	if ev != lab.EventWindow {
		return noSuchEvent(ev)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A settled key is forgotten as its retention's end forgets it; a
	// claim in flight keeps its key: its window starts when it settles.
	if e := s.entries[sc]; e != nil && e.state != inFlight {
		delete(s.entries, sc) // its expiry heap's item is skipped when it comes up
	}
	return nil
}

// noSuchEvent answers the events the design has nothing for. "wait" ends
// the twins' waits, which lab.WaitBound made: nothing is left to do.
func noSuchEvent(ev lab.TimeEvent) error {
	switch ev {
	case lab.EventWait:
		return nil
	case lab.EventTTL:
		return lab.Invalid("event", "memory has no TTL: a claim stays in the map until its owner settles it or the replica dies")
	case lab.EventLease:
		return lab.Invalid("event", "memory has no lease: a claim stays in the map until its owner settles it or the replica dies")
	case lab.EventFailover:
		return lab.Invalid("event", "memory has no Redis to fail over: its keys live in this process's heap")
	}
	return lab.Invalid("event", "memory has no %q to make happen", ev)
}

// held is what either path holds for a key, as a stepped run's view shows it.
type held struct {
	found       bool
	state       keyState
	holder      string // the stepped attempt that claimed it, if one did
	fingerprint string
	chargeID    string // while in flight or unsettled
	inherited   bool
	resp        lab.Response
	created     time.Time
	expires     time.Time // once settled
}

// inspection is h for a stepped run's view: an expired key is absent, as
// a claim finds it.
func (h held) inspection(now time.Time) lab.KeyInspection {
	in := lab.KeyInspection{Where: where, State: lab.KeyAbsent}
	switch {
	case !h.found:
		in.Facts = []string{"no entry: the next attempt claims the key"}
		return in
	case h.state != inFlight && !now.Before(h.expires):
		in.Facts = []string{fmt.Sprintf("its retention ended %s ago: the next attempt claims the key anew", lab.Span(now.Sub(h.expires)))}
		return in
	}
	switch h.state {
	case inFlight:
		in.State = lab.KeyInFlight
		in.Facts = append(in.Facts, fmt.Sprintf("claimed by %s %s ago, no response stored yet", who(h.holder), lab.Span(now.Sub(h.created))))
		if h.inherited {
			in.Facts = append(in.Facts, "it retries charge "+h.chargeID+", whose outcome was lost")
		} else {
			in.Facts = append(in.Facts, "its charge will be "+h.chargeID)
		}
	case unsettled:
		in.State = "unsettled"
		in.Facts = append(in.Facts, "the charge's outcome is unknown: a retry of the same request retries charge "+h.chargeID)
	default:
		in.State = lab.KeyCompleted
		by := ""
		if h.holder != "" {
			by = " by " + who(h.holder)
		}
		in.Facts = append(in.Facts, "completed"+by+": "+answered(h.resp))
	}
	if h.state != inFlight {
		in.Facts = append(in.Facts, "expires in "+lab.Span(h.expires.Sub(now)))
	}
	in.Facts = append(in.Facts, "fingerprint "+lab.ShortFingerprint(h.fingerprint))
	return in
}

// who names the holder of a claim: the stepped attempt, or a request.
func who(step string) string {
	if step == "" {
		return "a request"
	}
	n := step[strings.LastIndexByte(step, '/')+1:]
	return fmt.Sprintf("attempt %s (%s)", n, step)
}

// answered is a stored response in a few words: its status and the charge.
func answered(r lab.Response) string {
	var b struct {
		ID       string `json:"id"`
		Code     string `json:"code"`
		ChargeID string `json:"charge_id"`
	}
	_ = json.Unmarshal(r.Body, &b) // what it cannot read it does not show
	switch {
	case b.ID != "":
		return fmt.Sprintf("%d, charge %s", r.Status, b.ID)
	case b.ChargeID != "":
		return fmt.Sprintf("%d %s, the order's charge %s", r.Status, b.Code, b.ChargeID)
	}
	return fmt.Sprint(r.Status)
}

// The store is what a stepped run reads and moves.
var (
	_ lab.KeyInspector = (*Store)(nil)
	_ lab.TimeMover    = (*Store)(nil)
)
