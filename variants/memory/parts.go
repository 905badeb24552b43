package memory

// Namespace parts and a claim order linked through the entries, for the
// packed store: /idempotency/state lists the newest 20 of 300,000 keys in
// 44 µs, where the plain Store sorts them all, holding its lock, in 1.0 s
// (BenchmarkKeysOf300k, the Packed and Plain lines, medians of 6):
//
//	go test -run '^$' -bench BenchmarkKeysOf300k -benchmem -count 6 ./variants/memory/
//
// A crash, likewise, looks at its namespace's claims in flight, not at
// every key held. TestPackedAnswersAsPlain holds its listings, lookups,
// crashes and evictions to the plain Store's.

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// part is one namespace's keys, in the order they were claimed, so listing
// the newest costs what is listed, not what is held.
type part struct {
	entries map[string]*packedEntry // by id
	// oldest and newest end the claim order, a list linked through the
	// entries themselves: no list element per key.
	oldest, newest *packedEntry
	// inFlight holds the entries whose owner still works, so a crash or
	// the oldest-in-flight gauge looks at those and not at every key.
	inFlight map[*packedEntry]struct{}
}

// getLocked finds the entry of a scope, and its namespace's part.
func (s *Packed) getLocked(sc lab.Scope) (*packedEntry, *part) {
	p := s.parts[sc.Namespace]
	if p == nil {
		return nil, nil
	}
	var buf [128]byte // most ids fit: looking one up allocates nothing
	return p.entries[string(appendScopeID(buf[:0], sc))], p
}

// putLocked stores e in the namespace's part in place of old (nil when
// the scope had no entry): at the newest end of the claim order, or where
// old was when e takes old over, since it keeps old's age.
func (s *Packed) putLocked(ns lab.Namespace, p *part, old, e *packedEntry, takeOver bool) {
	if p == nil {
		p = &part{entries: map[string]*packedEntry{}, inFlight: map[*packedEntry]struct{}{}}
		s.parts[ns] = p
	}
	p.entries[e.id] = e
	p.inFlight[e] = struct{}{}
	if takeOver {
		p.replace(old, e)
		return
	}
	if old != nil {
		p.unlink(old)
	}
	e.prev, e.next = p.newest, nil
	if p.newest != nil {
		p.newest.next = e
	} else {
		p.oldest = e
	}
	p.newest = e
}

// replace puts e in old's place in the claim order.
func (p *part) replace(old, e *packedEntry) {
	e.prev, e.next = old.prev, old.next
	if e.prev != nil {
		e.prev.next = e
	} else {
		p.oldest = e
	}
	if e.next != nil {
		e.next.prev = e
	} else {
		p.newest = e
	}
	old.prev, old.next = nil, nil
}

// unlink takes e out of the claim order and the in-flight set.
func (p *part) unlink(e *packedEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		p.oldest = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		p.newest = e.prev
	}
	e.prev, e.next = nil, nil
	delete(p.inFlight, e)
}

// heldLocked is e's part when e is still the entry of its scope (not
// replaced, evicted or forgotten by a crash or restart), nil otherwise.
func (s *Packed) heldLocked(e *packedEntry) *part {
	p := s.parts[e.namespace()]
	if p == nil || p.entries[e.id] != e {
		return nil
	}
	return p
}

// deleteLocked forgets e, if it is still the entry of its scope.
func (s *Packed) deleteLocked(e *packedEntry) {
	p := s.heldLocked(e)
	if p == nil {
		return
	}
	delete(p.entries, e.id)
	p.unlink(e)
	if len(p.entries) == 0 {
		delete(s.parts, e.namespace())
	}
}

// crash loses the region's keys (its namespace's, or the confined part of
// them), as the death of this replica's process would lose them all, and
// takes down the requests waiting on them: their connections die too.
// Other namespaces keep theirs: one attendee's crash is not another's.
func (s *Packed) crash(r lab.Region) {
	s.mu.Lock()
	var dying []chan struct{}
	if p := s.parts[r.Namespace]; p != nil {
		for e := range p.inFlight {
			if r.KeyPrefix == "" || strings.HasPrefix(e.scope().Key, r.KeyPrefix) {
				e.state = crashed
				dying = append(dying, e.claim.done)
			}
		}
	}
	s.forgetLocked(r)
	s.mu.Unlock()
	for _, done := range dying {
		close(done)
	}
}

// forgetLocked drops the region's entries: a whole part at once, or the
// confined keys one by one.
func (s *Packed) forgetLocked(r lab.Region) {
	switch {
	case r.Namespace == "" && r.KeyPrefix == "":
		s.parts, s.expiry = map[lab.Namespace]*part{}, nil
	case r.KeyPrefix == "":
		delete(s.parts, r.Namespace)
	default:
		for ns, p := range s.parts {
			if r.Namespace != "" && ns != r.Namespace {
				continue
			}
			for _, e := range p.entries {
				if strings.HasPrefix(e.scope().Key, r.KeyPrefix) {
					s.deleteLocked(e)
				}
			}
		}
	}
}

// Restart forgets the region's keys, as a process restart does.
func (s *Packed) Restart(_ context.Context, r lab.Region) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(r)
	return nil
}

// Reset forgets the namespace's keys ("" for every key).
func (s *Packed) Reset(ctx context.Context, ns lab.Namespace) error {
	return s.Restart(ctx, lab.Region{Namespace: ns})
}

// Sweep evicts every expired key.
func (s *Packed) Sweep(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.evictLocked(s.at(s.now()), -1), nil
}

// evictLocked removes up to max expired entries (all when max < 0).
func (s *Packed) evictLocked(now int64, max int) int {
	n := 0
	for len(s.expiry) > 0 && n != max && now >= s.expiry[0].expiresAt {
		e := heap.Pop(&s.expiry).(*packedEntry)
		if s.heldLocked(e) != nil {
			s.deleteLocked(e)
			n++
		}
	}
	return n
}

// Len reports how many keys the store holds.
func (s *Packed) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.parts {
		n += len(p.entries)
	}
	return n
}

// Lookup reports the state of one key.
func (s *Packed) Lookup(_ context.Context, sc lab.Scope) (lab.KeyState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e, _ := s.getLocked(sc)
	if e == nil || e.state != inFlight && s.at(now) >= e.expiresAt {
		return lab.KeyState{Tenant: sc.Tenant, Key: sc.Key, State: lab.KeyAbsent}, nil
	}
	ks := s.keyState(e, now)
	if e.state == completed {
		ks.Response = e.body
	}
	return ks, nil
}

// keyState is the entry as /idempotency/state shows it; the caller holds s.mu.
func (s *Packed) keyState(e *packedEntry, now time.Time) lab.KeyState {
	sc, created := e.scope(), s.timeAt(e.createdAt)
	ks := lab.KeyState{
		Tenant: sc.Tenant, Key: sc.Key, State: lab.KeyInFlight, Fingerprint: hex.EncodeToString(e.fingerprint[:]),
		CreatedAt: created.UTC(), AgeMS: now.Sub(created).Milliseconds(),
	}
	if e.state == completed {
		ks.State, ks.Status, ks.ExpiresAt = lab.KeyCompleted, e.status, s.timeAt(e.expiresAt).UTC()
	}
	return ks
}

// Keys lists the namespace's newest keys ("" for every namespace's). It
// holds the lock for the keys it lists, never for all the store holds.
func (s *Packed) Keys(_ context.Context, ns lab.Namespace, limit int) ([]lab.KeyState, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var out []lab.KeyState
	total := 0
	for name, p := range s.parts {
		if ns != "" && name != ns {
			continue
		}
		total += len(p.entries)
		for e, n := p.newest, 0; e != nil && n < limit; e, n = e.prev, n+1 {
			out = append(out, s.keyState(e, now))
		}
	}
	// Each part gave its newest in claim order; across parts (the admin's
	// view) keep the newest overall.
	slices.SortStableFunc(out, func(x, y lab.KeyState) int { return y.CreatedAt.Compare(x.CreatedAt) })
	return out[:min(limit, len(out))], total, nil
}

// packedExpiry orders completed entries by expiry.
type packedExpiry []*packedEntry

func (h packedExpiry) Len() int           { return len(h) }
func (h packedExpiry) Less(i, j int) bool { return cmp.Less(h[i].expiresAt, h[j].expiresAt) }
func (h packedExpiry) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *packedExpiry) Push(x any)        { *h = append(*h, x.(*packedEntry)) }
func (h *packedExpiry) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// OldestInFlight reports the age of the oldest key claimed and not yet
// completed: a slow worker, or a crashed one whose claim nobody settled.
func (s *Packed) OldestInFlight(context.Context) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.at(s.now())
	var oldest time.Duration
	for _, p := range s.parts {
		for e := range p.inFlight {
			oldest = max(oldest, time.Duration(now-e.createdAt))
		}
	}
	return oldest, nil
}
