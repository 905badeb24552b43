package step

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// View is where a stepped run stands.
type View struct {
	ID       string        `json:"id"`
	Store    lab.StoreName `json:"store"`
	Key      string        `json:"key"`
	Schedule string        `json:"schedule,omitempty"` // the named schedule played, if any
	Planned  []Move        `json:"planned,omitempty"`  // the named schedule's moves
	Faults   string        `json:"faults,omitempty"`   // the Lab-Fault of its first attempt
	Replicas int           `json:"replicas"`           // the distinct replicas its attempts reach
	Count    int           `json:"attempt_count"`      // how many attempts it has
	Steps    []Move        `json:"steps"`              // the moves made so far, in order: the schedule to replay it
	Over     bool          `json:"over"`               // every attempt answered
	Aborted  string        `json:"aborted,omitempty"`  // why the run was aborted
	Attempts []AttemptView `json:"attempts"`
	// Moves are the moves made, each with where the attempts stood and
	// what the store held for the key after it.
	Moves []MoveRecord `json:"moves"`
	// Store is what the store holds for the key now (as of the last move).
	Holds []lab.KeyInspection `json:"store_state"`
	// Verdict is the finished run as recorded in the history, checked.
	*Verdict
}

// AttemptView is where one attempt stands.
type AttemptView struct {
	Attempt int              `json:"attempt"`
	Target  string           `json:"target"` // the base URL of the replica it is sent to
	State   State            `json:"state"`
	Point   lab.PausePoint   `json:"point,omitempty"` // where it waits, when paused
	Passed  []lab.PausePoint `json:"passed"`          // every point it reached
	Blocked string           `json:"blocked_on,omitempty"`
	Answer  *Answer          `json:"answer,omitempty"`
	// SentMS and AnswerMS are when it was sent and answered, on the run's
	// axis (from the run's opening); absent until then.
	SentMS   *float64 `json:"sent_ms,omitempty"`
	AnswerMS *float64 `json:"answer_ms,omitempty"`
}

// ownsKey reports whether an attempt paused at p owns its key: an attempt
// blocked meanwhile most likely waits on what it holds.
func ownsKey(p lab.PausePoint) bool {
	switch p {
	case lab.PointAfterClaim, lab.PointAfterWork, lab.PointAfterCharge, lab.PointBeforeResponseStored:
		return true
	}
	return false
}

// View is where the run stands now.
func (r *Run) View() View {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := View{ID: r.id, Store: r.spec.Store, Key: r.spec.Key, Schedule: r.spec.Schedule, Planned: r.spec.Planned,
		Faults: r.spec.Faults, Steps: []Move{}, Over: r.overLocked(), Aborted: r.aborted, Moves: slices.Clone(r.moves),
		Holds: []lab.KeyInspection{}, Verdict: r.verdict}
	for _, m := range r.moves {
		v.Steps = append(v.Steps, m.Move)
	}
	if v.Moves == nil {
		v.Moves = []MoveRecord{}
	}
	if len(r.moves) > 0 {
		v.Holds = r.moves[len(r.moves)-1].Store
	}
	v.Attempts = r.attemptViewsLocked(v.Holds)
	v.Count, v.Replicas = len(r.attempts), len(slices.Compact(slices.Sorted(slices.Values(r.spec.Replicas))))
	return v
}

// axis is t on the run's time axis, nil for a time not yet reached.
func (r *Run) axis(t time.Time) *float64 {
	if t.IsZero() {
		return nil
	}
	ms := float64(t.Sub(r.started).Microseconds()) / 1000
	return &ms
}

// attemptViewsLocked is where each attempt stands, given what the store
// held for the key after the last move.
func (r *Run) attemptViewsLocked(holds []lab.KeyInspection) []AttemptView {
	var holders []string
	for _, a := range r.attempts {
		if a.state == StatePaused && ownsKey(a.point) {
			holders = append(holders, fmt.Sprintf("attempt %d (paused at %s)", a.n, a.point))
		}
	}
	var out []AttemptView
	for _, a := range r.attempts {
		av := AttemptView{Attempt: a.n, Target: r.spec.Replicas[a.n-1], State: a.state, Point: a.point,
			Passed: append([]lab.PausePoint{}, a.passed...)}
		if a.answer != nil {
			ans := *a.answer
			av.Answer = &ans
		}
		av.SentMS, av.AnswerMS = r.axis(a.sentAt), r.axis(a.answerAt)
		if a.state == StateBlocked {
			av.Blocked = "the store: it reached no pause point and no answer within the settle time"
			if len(holders) > 0 {
				av.Blocked = "the store, on what is held by " + strings.Join(holders, ", ")
			}
			for _, in := range holds { // what the store itself sees it wait on, when it can say
				if on, ok := in.Blocked[strconv.Itoa(a.n)]; ok {
					av.Blocked = on
				}
			}
		}
		out = append(out, av)
	}
	return out
}
