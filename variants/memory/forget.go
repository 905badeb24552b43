package memory

import (
	"container/heap"
	"context"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// What the Store loses: its keys in a crash or a restart of the
// process, which is the design's weakness, and each key after its window,
// which bounds its memory.

// crash loses the region's keys (its namespace's, or the confined part of
// them), as the death of this replica's process would lose them all, and
// takes down the requests waiting on them: their connections die too.
// Other namespaces keep theirs: one attendee's crash is not another's.
func (s *Store) crash(r lab.Region) {
	s.mu.Lock()
	var dying []chan struct{}
	for sc, e := range s.entries {
		if e.state == inFlight && r.Covers(sc) {
			e.state = crashed
			dying = append(dying, e.done)
		}
	}
	s.forgetLocked(r)
	s.mu.Unlock()
	for _, done := range dying {
		close(done)
	}
}

// forgetLocked drops the region's entries.
func (s *Store) forgetLocked(r lab.Region) {
	if r == (lab.Region{}) {
		s.entries, s.expiry = map[lab.Scope]*entry{}, nil
		return
	}
	for sc := range s.entries {
		if r.Covers(sc) {
			delete(s.entries, sc)
		}
	}
}

// Restart forgets the region's keys, as a process restart does.
func (s *Store) Restart(_ context.Context, r lab.Region) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(r)
	return nil
}

// Reset forgets the namespace's keys ("" for every key).
func (s *Store) Reset(ctx context.Context, ns lab.Namespace) error {
	return s.Restart(ctx, lab.Region{Namespace: ns})
}

// Sweep evicts every expired key.
func (s *Store) Sweep(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.evictLocked(s.now(), -1), nil
}

// evictLocked removes up to max expired entries (all when max < 0), those
// that expire first first.
func (s *Store) evictLocked(now time.Time, max int) int {
	n := 0
	for len(s.expiry) > 0 && n != max && !now.Before(s.expiry[0].expiresAt) {
		e := s.expiry.pop()
		if s.entries[e.scope] == e { // not replaced or forgotten meanwhile
			delete(s.entries, e.scope)
			n++
		}
	}
	return n
}

// expiryHeap orders settled entries by expiry.
type expiryHeap []*entry

func (h *expiryHeap) push(e *entry) { heap.Push(h, e) }
func (h *expiryHeap) pop() *entry   { return heap.Pop(h).(*entry) }

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].expiresAt.Before(h[j].expiresAt) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(*entry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
