package memory

// Packed keys: 424 bytes per retained key instead of the plain Store's 806,
// 47 % less (BenchmarkRetainedKeys at 300,000 keys, the Packed and Plain
// lines; the figure does not vary from run to run):
//
//	go test -run '^$' -bench BenchmarkRetainedKeys -benchmem -count 6 ./variants/memory/
//
// The scope is one string, its id, instead of four; the fingerprint 32
// bytes instead of 64 hex digits; times 8-byte offsets instead of
// time.Time's 24; and what only a claim needs (its charge id, its channel)
// is dropped when the key completes. It buys memory only: a claim and a
// replay cost the same as the plain Store's within the machine's noise
// (BenchmarkClaim, BenchmarkReplay). TestPackedAnswersAsPlain holds it to
// the plain Store's answers and ledger effects, step by step, and the
// conformance suite runs on both (TestConformance, TestConformancePlain).

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// Packed is the memory store with its keys packed: the same claim, charge,
// completion and replay as Store (store.go), step for step, over entries
// that keep nothing they can derive, kept apart per namespace (parts.go).
type Packed struct {
	ledger lab.Ledger
	window time.Duration // how long completed keys are kept
	wait   time.Duration // bound on waiting for an in-flight twin
	now    lab.Clock
	// epoch is the clock's reading when the store opened: entries keep
	// their times as offsets from it (see Packed.at).
	epoch time.Time

	mu sync.Mutex
	// parts holds each namespace's keys apart, so a crash or a restart
	// one attendee injects forgets their keys and nobody else's.
	parts  map[lab.Namespace]*part
	expiry packedExpiry // every part's completed entries; stale ones are skipped
	// holders names the stepped attempt that claimed an entry (stepping.go).
	holders map[*packedEntry]string
}

// packedEntry is one key. A retained key costs this struct, its id and its
// response body, so it holds nothing it can derive: the scope is decoded
// from the id, the fingerprint kept as bytes, times as offsets, and what
// only a claim needs is dropped when it completes. It takes 128 bytes, a
// size class of the allocator: one more word would cost 16 more per key.
type packedEntry struct {
	id          string // the scope as appendScopeID encodes it: the map key, and the only copy kept
	fingerprint [sha256.Size]byte
	body        []byte       // the stored response's, once completed: replays share it
	claim       *claim       // while in flight or unsettled; nil once completed
	createdAt   int64        // offsets on the store's clock, see Packed.at
	expiresAt   int64        // set once completed or unsettled
	prev, next  *packedEntry // in the part's claim order, oldest first
	status      int          // the stored response's, once completed
	state       keyState
}

// claim is what a packed entry needs only until it completes.
type claim struct {
	// done is closed when the owner completes, gives up, or dies in a
	// crash. Waiters take it from the entry under the lock (see
	// Packed.claim); it is dropped with the claim.
	done     chan struct{}
	chargeID string // the charge this key may apply; kept across an unknown outcome
	// inherited: chargeID came from an unsettled entry: never give it up.
	inherited bool
}

// NewPacked returns an empty memory store that packs its keys.
func NewPacked(cfg Config) (*Packed, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return &Packed{ledger: cfg.Ledger, window: cfg.Window, wait: cfg.Wait, now: cfg.Now, epoch: cfg.Now(),
		parts: map[lab.Namespace]*part{}}, nil
}

// at is t as a packed entry keeps it: 8 bytes where a time.Time takes 24. An
// offset from the store's epoch, not Unix nanoseconds, so that a clock with
// a monotonic reading (time.Now) is compared by it, as time.Time compares.
func (s *Packed) at(t time.Time) int64 { return int64(t.Sub(s.epoch)) }

// timeAt is the instant at stands for.
func (s *Packed) timeAt(at int64) time.Time { return s.epoch.Add(time.Duration(at)) }

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
func (e *packedEntry) scope() lab.Scope {
	ns, rest := cutField(e.id)
	tenant, rest := cutField(rest)
	endpoint, key := cutField(rest)
	return lab.Scope{Namespace: lab.Namespace(ns), Tenant: tenant, Endpoint: endpoint, Key: key}
}

// namespace is the namespace the entry's id holds.
func (e *packedEntry) namespace() lab.Namespace {
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

// fingerprintOf is the fingerprint a packed entry keeps: the bytes of the hex
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
func (e *packedEntry) response() lab.Response { return lab.Response{Status: e.status, Body: e.body} }
