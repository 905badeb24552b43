// Package memory is the design that holds on one replica: idempotency keys
// in a map in the process heap, claimed under a mutex.
package memory

import (
	"cmp"
	"container/heap"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Store keeps idempotency keys in a map in this process's heap. The claim is
// one atomic step under a mutex, which is right for one replica and wrong for
// two: each replica has its own map.
type Store struct {
	ledger lab.Ledger
	window time.Duration // how long completed keys are kept
	wait   time.Duration // bound on waiting for an in-flight twin
	now    lab.Clock
	// epoch is the clock's reading when the store opened: entries keep
	// their times as offsets from it (see Store.at).
	epoch time.Time

	mu sync.Mutex
	// parts holds each namespace's keys apart, so a crash or a restart
	// one attendee injects forgets their keys and nobody else's.
	parts  map[lab.Namespace]*part
	expiry expiryHeap // every part's completed entries; stale ones are skipped
}

// part is one namespace's keys, in the order they were claimed, so listing
// the newest costs what is listed, not what is held.
type part struct {
	entries map[string]*entry // by id
	// oldest and newest end the claim order, a list linked through the
	// entries themselves: no list element per key.
	oldest, newest *entry
	// inFlight holds the entries whose owner still works, so a crash or
	// the oldest-in-flight gauge looks at those and not at every key.
	inFlight map[*entry]struct{}
}

// entry is one key. A retained key costs this struct, its id and its
// response body, so it holds nothing it can derive: the scope is decoded
// from the id, the fingerprint kept as bytes, times as offsets, and what
// only a claim needs is dropped when it completes. It takes 128 bytes, a
// size class of the allocator: one more word would cost 16 more per key.
type entry struct {
	id          string // the scope as appendScopeID encodes it: the map key, and the only copy kept
	fingerprint [sha256.Size]byte
	body        []byte // the stored response's, once completed: replays share it
	claim       *claim // while in flight or unsettled; nil once completed
	createdAt   int64  // offsets on the store's clock, see Store.at
	expiresAt   int64  // set once completed or unsettled
	prev, next  *entry // in the part's claim order, oldest first
	status      int    // the stored response's, once completed
	state       keyState
}

// claim is what an entry needs only until it completes.
type claim struct {
	// done is closed when the owner completes, gives up, or dies in a
	// crash. Waiters take it from the entry under the lock (see
	// Store.claim); it is dropped with the claim.
	done     chan struct{}
	chargeID string // the charge this key may apply; kept across an unknown outcome
	// inherited: chargeID came from an unsettled entry: never give it up.
	inherited bool
}

// keyState is where an entry stands.
type keyState uint8

const (
	inFlight  keyState = iota // claimed: its owner works
	completed                 // body and status hold the response
	unsettled                 // the charge's outcome is unknown: a retry of the same request retries its charge id
	crashed                   // the replica crashed under its owner; no longer in any part
)

// Config configures a memory Store; every field is required.
type Config struct {
	Ledger lab.Ledger
	Window time.Duration // retention of completed keys
	Wait   time.Duration // bounded wait for an in-flight twin
	Now    lab.Clock
}

// New returns an empty memory store.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.Ledger == nil || cfg.Now == nil:
		return nil, errors.New("memory: ledger and clock are required")
	case cfg.Window <= 0 || cfg.Wait <= 0:
		return nil, fmt.Errorf("memory: window and wait must be positive (got %s, %s)", cfg.Window, cfg.Wait)
	}
	return &Store{ledger: cfg.Ledger, window: cfg.Window, wait: cfg.Wait, now: cfg.Now, epoch: cfg.Now(),
		parts: map[lab.Namespace]*part{}}, nil
}

// at is t as an entry keeps it: 8 bytes where a time.Time takes 24. An
// offset from the store's epoch, not Unix nanoseconds, so that a clock with
// a monotonic reading (time.Now) is compared by it, as time.Time compares.
func (s *Store) at(t time.Time) int64 { return int64(t.Sub(s.epoch)) }

// timeAt is the instant at stands for.
func (s *Store) timeAt(at int64) time.Time { return s.epoch.Add(time.Duration(at)) }

// appendScopeID appends the id of a scope: the namespace, the tenant and
// the endpoint, each after its length, then the key. Lengths rather than
// separators, so that no two scopes share an id whatever bytes they hold.
func appendScopeID(b []byte, sc lab.Scope) []byte {
	b = binary.AppendUvarint(b, uint64(len(sc.Namespace)))
	b = append(b, sc.Namespace...)
	b = binary.AppendUvarint(b, uint64(len(sc.Tenant)))
	b = append(b, sc.Tenant...)
	b = binary.AppendUvarint(b, uint64(len(sc.Endpoint)))
	b = append(b, sc.Endpoint...)
	return append(b, sc.Key...)
}

// scope decodes the entry's id.
func (e *entry) scope() lab.Scope {
	ns, rest := cutField(e.id)
	tenant, rest := cutField(rest)
	endpoint, key := cutField(rest)
	return lab.Scope{Namespace: lab.Namespace(ns), Tenant: tenant, Endpoint: endpoint, Key: key}
}

// namespace is the namespace the entry's id holds.
func (e *entry) namespace() lab.Namespace {
	ns, _ := cutField(e.id)
	return lab.Namespace(ns)
}

// cutField splits a field appendScopeID wrote, its length first, from what
// follows it.
func cutField(s string) (field, rest string) {
	n, w := binary.Uvarint([]byte(s[:min(len(s), binary.MaxVarintLen64)]))
	end := w + int(n)
	return s[w:end], s[end:]
}

// fingerprintOf is the fingerprint an entry keeps: the bytes of the hex
// SHA-256 that lab.ChargeRequest.Fingerprint gives. Any other string is
// hashed instead, so that equal fingerprints still compare equal and
// different ones differ (only Lookup then shows the hash, not the string).
func fingerprintOf(s string) [sha256.Size]byte {
	var fp [sha256.Size]byte
	if len(s) != hex.EncodedLen(len(fp)) {
		return sha256.Sum256([]byte(s))
	}
	for i := range fp {
		hi, lo := lowerHex(s[2*i]), lowerHex(s[2*i+1])
		if hi > 0xf || lo > 0xf { // upper case too: "AB…" must not equal "ab…"
			return sha256.Sum256([]byte(s))
		}
		fp[i] = hi<<4 | lo
	}
	return fp
}

// lowerHex is the value of a lower-case hex digit, 0xff for anything else.
func lowerHex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return 0xff
}

// response is what a completed entry answers.
func (e *entry) response() lab.Response { return lab.Response{Status: e.status, Body: e.body} }

// getLocked finds the entry of a scope, and its namespace's part.
func (s *Store) getLocked(sc lab.Scope) (*entry, *part) {
	p := s.parts[sc.Namespace]
	if p == nil {
		return nil, nil
	}
	var buf [128]byte // most ids fit: looking one up allocates nothing
	return p.entries[string(appendScopeID(buf[:0], sc))], p
}

// putLocked stores e in the namespace's part, in place of old (nil when
// the scope had no entry).
func (s *Store) putLocked(ns lab.Namespace, p *part, old, e *entry) {
	if p == nil {
		p = &part{entries: map[string]*entry{}, inFlight: map[*entry]struct{}{}}
		s.parts[ns] = p
	}
	if old != nil {
		p.unlink(old)
	}
	p.entries[e.id] = e
	p.inFlight[e] = struct{}{}
	e.prev, e.next = p.newest, nil
	if p.newest != nil {
		p.newest.next = e
	} else {
		p.oldest = e
	}
	p.newest = e
}

// unlink takes e out of the claim order and the in-flight set.
func (p *part) unlink(e *entry) {
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
func (s *Store) heldLocked(e *entry) *part {
	p := s.parts[e.namespace()]
	if p == nil || p.entries[e.id] != e {
		return nil
	}
	return p
}

// deleteLocked forgets e, if it is still the entry of its scope.
func (s *Store) deleteLocked(e *entry) {
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

// settleLocked records that e's owner no longer works on it: completed or
// unsettled, e expires on its own.
func (s *Store) settleLocked(e *entry, state keyState, retention time.Duration) {
	e.state = state
	e.expiresAt = s.at(s.now().Add(retention))
	if p := s.heldLocked(e); p != nil { // not forgotten by a restart meanwhile
		delete(p.inFlight, e)
		heap.Push(&s.expiry, e)
	}
	close(e.claim.done)
	e.claim.done = nil
}

// Name is the store's name.
func (s *Store) Name() lab.StoreName { return Name }

// Charge claims the key or waits for its twin, then charges at most once per replica.
func (s *Store) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	fp := fingerprintOf(a.Fingerprint)
	var deadline *time.Timer // started by the first wait: a first attempt or a replay needs none
	defer func() {
		if deadline != nil {
			deadline.Stop()
		}
	}()
	for {
		e, done, claimed := s.claim(a, fp)
		switch {
		case claimed:
			return s.perform(ctx, e, a)
		case e.fingerprint != fp:
			return lab.Outcome{}, lab.ErrKeyReused
		case done == nil: // completed: its response never changes
			return lab.Outcome{Response: e.response(), Replayed: true}, nil
		}
		if deadline == nil {
			deadline = time.NewTimer(s.wait)
		}
		select {
		case <-done:
			// What the owner set before closing done stays: read it.
			switch e.state {
			case crashed:
				return lab.Outcome{}, lab.ErrCrash // the replica died under this request too
			case completed:
				return lab.Outcome{Response: e.response(), Replayed: true}, nil
			}
			// The first request gave up and released the key, or its
			// outcome is unknown: compete again.
		case <-deadline.C:
			return lab.Outcome{}, &lab.InProgressError{RetryAfter: time.Second}
		case <-ctx.Done():
			return lab.Outcome{}, ctx.Err()
		}
	}
}

// claim returns the live entry of the attempt's scope, creating it (claimed=true) when absent
// or expired, or taking over one whose outcome is unknown with its charge id. When another
// request holds the entry, done is its claim's channel, read here under the lock because the
// claim is dropped when it completes; nil when the entry is settled.
func (s *Store) claim(a lab.Attempt, fp [sha256.Size]byte) (e *entry, done chan struct{}, claimed bool) {
	now := s.now()
	at := s.at(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked(at, 2) // amortised eviction keeps the table bounded without a sweeper
	old, p := s.getLocked(a.Scope)
	var unsettledSame *entry // an unsettled entry of the same request, whose charge this claim retries
	if old != nil {
		switch {
		case old.state == unsettled && at >= old.expiresAt:
			// Unsettled past its retention: forgotten like any expired key.
		case old.state == unsettled && old.fingerprint == fp:
			// Retry the same charge: if the lost commit landed, the ledger
			// returns it instead of charging again.
			unsettledSame = old
		case old.state == inFlight:
			return old, old.claim.done, false
		case old.state == unsettled || at < old.expiresAt:
			return old, nil, false
		}
	}
	e = &entry{fingerprint: fp, createdAt: at, claim: &claim{done: make(chan struct{})}}
	if unsettledSame != nil {
		e.claim.chargeID, e.createdAt, e.claim.inherited = unsettledSame.claim.chargeID, unsettledSame.createdAt, true
	} else {
		e.claim.chargeID = lab.NewChargeID()
	}
	if old != nil {
		e.id = old.id // the same scope: share its id
	} else {
		var buf [128]byte // built on the stack: the string is the one allocation
		e.id = string(appendScopeID(buf[:0], a.Scope))
	}
	s.putLocked(a.Scope.Namespace, p, old, e)
	return e, nil, true
}

func (s *Store) perform(ctx context.Context, e *entry, a lab.Attempt) (lab.Outcome, error) {
	if a.Faults.Has(lab.FaultCrashAfterClaim) {
		s.crash(lab.CrashRegion(a))
		return lab.Outcome{}, lab.ErrCrash
	}
	lab.Mark(ctx, lab.PhaseClaim)
	c := e.claim // the owner's until it settles the entry: nobody else changes it
	a.ChargeID = c.chargeID
	resp, err := lab.Perform(ctx, s.ledger, a, s.now())
	if errors.Is(err, lab.ErrOutcomeUnknown) || err != nil && c.inherited {
		// Maybe charged (now, or by the lost commit whose id this entry
		// carries): keep the key and its charge id for the next attempt.
		s.settleLater(e, a)
		return lab.Outcome{}, err
	}
	if err != nil {
		s.release(e) // nothing was charged
		return lab.Outcome{}, err
	}
	if a.Faults.Has(lab.FaultCrashAfterCharge) {
		s.crash(lab.CrashRegion(a))
		return lab.Outcome{}, lab.ErrCrash
	}
	retention := a.Faults.RetentionOr(s.window)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.state == crashed { // the replica "died" meanwhile: this request dies with it
		return lab.Outcome{}, lab.ErrCrash
	}
	e.body, e.status = resp.Body, resp.Status
	s.settleLocked(e, completed, retention)
	e.claim = nil // its charge id and channel are no longer needed
	return lab.Outcome{Response: resp}, nil
}

// release forgets a claim whose work failed before anything was charged, so
// a retry may run it again.
func (s *Store) release(e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleteLocked(e)
	if e.state != crashed { // a crash closed it
		close(e.claim.done)
	}
}

// settleLater keeps an entry whose charge may have been applied: the next
// attempt with the same request retries the same charge id.
func (s *Store) settleLater(e *entry, a lab.Attempt) {
	retention := a.Faults.RetentionOr(s.window)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.state == crashed {
		return
	}
	s.settleLocked(e, unsettled, retention) // kept no longer than a completed key
}

// crash loses the region's keys (its namespace's, or the confined part of
// them), as the death of this replica's process would lose them all, and
// takes down the requests waiting on them: their connections die too.
// Other namespaces keep theirs: one attendee's crash is not another's.
func (s *Store) crash(r lab.Region) {
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
func (s *Store) forgetLocked(r lab.Region) {
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
	return s.evictLocked(s.at(s.now()), -1), nil
}

// evictLocked removes up to max expired entries (all when max < 0).
func (s *Store) evictLocked(now int64, max int) int {
	n := 0
	for len(s.expiry) > 0 && n != max && now >= s.expiry[0].expiresAt {
		e := heap.Pop(&s.expiry).(*entry)
		if s.heldLocked(e) != nil {
			s.deleteLocked(e)
			n++
		}
	}
	return n
}

// Len reports how many keys the store holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.parts {
		n += len(p.entries)
	}
	return n
}

// Lookup reports the state of one key.
func (s *Store) Lookup(_ context.Context, sc lab.Scope) (lab.KeyState, error) {
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
func (s *Store) keyState(e *entry, now time.Time) lab.KeyState {
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
func (s *Store) Keys(_ context.Context, ns lab.Namespace, limit int) ([]lab.KeyState, int, error) {
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

// expiryHeap orders completed entries by expiry.
type expiryHeap []*entry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return cmp.Less(h[i].expiresAt, h[j].expiresAt) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(*entry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// OldestInFlight reports the age of the oldest key claimed and not yet
// completed: a slow worker, or a crashed one whose claim nobody settled.
func (s *Store) OldestInFlight(context.Context) (time.Duration, error) {
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
