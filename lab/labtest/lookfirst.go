package labtest

import (
	"context"
	"sync"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

// LookFirst is the toy variant of docs/design.md ("Adding a variant"),
// which tests register beside the built-in ones: it looks the key up and
// charges when it finds nothing. Between the look and the charge there is a
// gap, so concurrent twins all find nothing.
func LookFirst() variant.Variant {
	return variant.Variant{
		Name: "look-first", Label: "look, then charge", RequiresKey: true, Effects: "outbox",
		Crash:   variant.CrashWipesHeap, // its map is in the heap
		Decides: "reads the key, charges when absent: check-then-act",
		Keys:    "a map in this replica's heap, read and written under separate locks",
		Open: func(_ context.Context, d variant.Deps) (lab.Store, error) {
			return &lookFirst{ledger: d.Ledger, now: d.Clock, seen: map[string]lab.Response{}}, nil
		},
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries: {Usual: lab.Breaks, Holds: "the attempts happened not to overlap",
				Breaks: "every twin looked before any had charged: each found nothing and charged"},
		},
	}
}

type lookFirst struct {
	ledger lab.Ledger
	now    lab.Clock
	mu     sync.Mutex
	seen   map[string]lab.Response
}

func (s *lookFirst) Name() lab.StoreName { return "look-first" }

func (s *lookFirst) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	s.mu.Lock()
	resp, ok := s.seen[a.Scope.String()]
	s.mu.Unlock()
	if ok {
		return lab.Outcome{Response: resp, Replayed: true}, nil
	}
	resp, err := lab.Perform(ctx, s.ledger, a, s.now()) // the gap: a twin may be here too
	if err != nil {
		return lab.Outcome{}, err
	}
	s.mu.Lock()
	s.seen[a.Scope.String()] = resp
	s.mu.Unlock()
	return lab.Outcome{Response: resp}, nil
}
