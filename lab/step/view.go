package step

import (
	"fmt"
	"slices"
	"strings"

	"github.com/idempotency-lab/lab/lab"
)

// View is where a stepped run stands.
type View struct {
	ID       string        `json:"id"`
	Store    lab.StoreName `json:"store"`
	Key      string        `json:"key"`
	Schedule string        `json:"schedule,omitempty"` // the named schedule played, if any
	Steps    []int         `json:"steps"`              // the attempts advanced so far, in order
	Over     bool          `json:"over"`               // every attempt answered
	Aborted  string        `json:"aborted,omitempty"`  // why the run was aborted
	Attempts []AttemptView `json:"attempts"`
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
}

// holds reports whether an attempt paused at p owns its key: an attempt
// blocked meanwhile most likely waits on what it holds.
func holds(p lab.PausePoint) bool {
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
	v := View{ID: r.id, Store: r.spec.Store, Key: r.spec.Key, Schedule: r.spec.Schedule,
		Steps: slices.Clone(r.steps), Over: r.overLocked(), Aborted: r.aborted}
	if v.Steps == nil {
		v.Steps = []int{}
	}
	var holders []string
	for _, a := range r.attempts {
		if a.state == StatePaused && holds(a.point) {
			holders = append(holders, fmt.Sprintf("attempt %d (paused at %s)", a.n, a.point))
		}
	}
	for _, a := range r.attempts {
		av := AttemptView{Attempt: a.n, Target: r.spec.Replicas[a.n-1], State: a.state, Point: a.point,
			Passed: append([]lab.PausePoint{}, a.passed...)}
		if a.answer != nil {
			ans := *a.answer
			av.Answer = &ans
		}
		if a.state == StateBlocked {
			av.Blocked = "the store: it reached no pause point and no answer within the settle time"
			if len(holders) > 0 {
				av.Blocked = "the store, on what is held by " + strings.Join(holders, ", ")
			}
		}
		v.Attempts = append(v.Attempts, av)
	}
	return v
}
