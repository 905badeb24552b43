package lookfirst

// What a stepped run reads and moves here: the key's recorded answer, and
// its retention window made to pass now. Nothing is in flight for a
// reader to see: an attempt that looked and found nothing left no mark,
// which is the design's flaw.

import (
	"context"
	"fmt"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Inspect says whether the map holds an answer for the key.
func (s *Store) Inspect(_ context.Context, sc lab.Scope) (lab.KeyInspection, error) {
	in := lab.KeyInspection{Where: "this replica's map", State: lab.KeyAbsent,
		Facts: []string{"no answer recorded: an attempt that looked left no mark"}}
	if ans, ok := s.look(sc); ok {
		in.State = lab.KeyCompleted
		in.Facts = []string{fmt.Sprintf("answer %d recorded, kept %s more", ans.resp.Status, ans.expires.Sub(s.now()).Round(time.Second))}
	}
	return in, nil
}

// TimeMoves are the events a look-first key lives by.
func (s *Store) TimeMoves() []lab.TimeEvent { return []lab.TimeEvent{lab.EventWindow, lab.EventWait} }

// MakeHappen forgets the key's answer ("window"); "wait" has nothing to
// end: look-first never waits.
func (s *Store) MakeHappen(_ context.Context, sc lab.Scope, e lab.TimeEvent) error {
	switch e {
	case lab.EventWindow:
		s.mu.Lock()
		delete(s.seen, sc)
		s.mu.Unlock()
		return nil
	case lab.EventWait:
		return nil
	}
	return lab.Invalid("event", "%s has no %s: it keeps only answers, in this replica's map", Name, e)
}
