package memory_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
)

// TestPackedAnswersAsPlain: the packed store (packed.go, parts.go) is the
// plain Store (store.go) in less memory, nothing else. Both run the same
// random histories — charges and retries across tenants, namespaces and
// keys, reused keys, lost commits, crashes (confined or not), failed
// outbox writes, short retentions, restarts, resets, sweeps, clock jumps
// and stepped runs' window moves — each on books and a clock of its own,
// and after every step they must have given the same answer, shown the
// same keys (to Lookup and to Inspect) and left the same ledger and
// outbox. Charge ids, random by design, are compared by the order they
// first appear in.
func TestPackedAnswersAsPlain(t *testing.T) {
	t.Parallel()
	const histories, steps = 200, 60
	seen := map[string]int{} // the answers the histories reached, by kind
	for seed := range uint64(histories) {
		// In a bubble, the ledger retries after a lost commit sleep no time.
		synctest.Test(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 22))
			plain, packed := newTwin(t, "Plain"), newTwin(t, "Packed")
			var history []string
			for range steps {
				step := randomStep(rng)
				history = append(history, step.String())
				got, want := packed.do(t, step), plain.do(t, step)
				if field, g, w := firstDifference(got, want); field != "" {
					t.Fatalf("seed %d, after\n\t%s\npacked shows %s\n\t%s\nthe plain Store\n\t%s",
						seed, strings.Join(history, "\n\t"), field, g, w)
				}
				seen[answerKind(want.Answer)]++
			}
		})
	}
	// The histories reached every answer the design gives: first charges,
	// replays, an order the ledger refused (and its replay), reused keys,
	// crashes, unknown outcomes and failed outbox writes.
	for _, kind := range []string{"201 replayed=false", "201 replayed=true", "409 replayed=false", "409 replayed=true",
		lab.ErrKeyReused.Error(), lab.ErrCrash.Error(), lab.ErrOutcomeUnknown.Error(), "outbox"} {
		if seen[kind] == 0 {
			t.Errorf("no history reached %q (reached: %v)", kind, seen)
		}
	}
}

// answerKind is what kind of answer a step gave.
func answerKind(answer string) string {
	for _, kind := range []string{"201 replayed=false", "201 replayed=true", "409 replayed=false", "409 replayed=true",
		lab.ErrKeyReused.Error(), lab.ErrCrash.Error(), lab.ErrOutcomeUnknown.Error(), "outbox"} {
		if strings.HasPrefix(answer, kind) || strings.HasPrefix(answer, "error ") && strings.Contains(answer, kind) {
			return kind
		}
	}
	return ""
}

// view is what a step answered and what the store and the ledger show
// after it.
type view struct {
	Answer  string
	Lookups []lab.KeyState      // every scope of stepTenants × stepKeys
	Inspect []lab.KeyInspection // likewise
	Tallies []lab.KeyTally      // the ledger's, likewise
	Newest  [][]lab.KeyState
	Totals  []int
	Every   []lab.KeyState // every namespace's keys, sorted
	Len     int
	Oldest  time.Duration
	Summary []lab.StoreSummary
	Outbox  lab.OutboxStats
}

// firstDifference names the first field where got and want differ, and
// renders both; "" when they are equal.
func firstDifference(got, want view) (field, g, w string) {
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range gv.NumField() {
		if x, y := gv.Field(i).Interface(), wv.Field(i).Interface(); !reflect.DeepEqual(x, y) {
			return gv.Type().Field(i).Name, fmt.Sprintf("%+v", x), fmt.Sprintf("%+v", y)
		}
	}
	return "", "", ""
}

// twin is one path's store with its own books and clock.
type twin struct {
	store    store
	books    *inmem.Books
	clock    *labtest.Clock
	failures *atomic.Int32 // commits whose answer the ledger still loses
	ids      map[string]string
}

func newTwin(t *testing.T, name string) *twin {
	t.Helper()
	w := &twin{clock: labtest.NewClock(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)), failures: new(atomic.Int32), ids: map[string]string{}}
	w.books = inmem.NewBooks(w.clock.Now)
	for _, p := range paths() {
		if p.name == name {
			w.store = p.builder()(t, memory.Config{Ledger: labtest.LostCommit{Ledger: w.books, Failures: w.failures},
				Window: time.Hour, Wait: time.Second, Now: w.clock.Now})
		}
	}
	return w
}

// The scopes a history plays with: three tenants in two namespaces, and
// keys under the prefix a confined crash forgets and outside it.
func stepTenants() []string { return []string{"a", "a" + lab.SecondTenantSuffix, "b"} }
func stepKeys() []string    { return []string{"k0", "k1", "m-0", "m-1"} }

// step is one move of a history.
type step struct {
	kind    string // charge, lose, advance, window, restart, reset, sweep
	tenant  string
	key     string
	amount  int64
	order   string
	faults  lab.Faults
	lose    int32
	advance time.Duration
	region  lab.Region
}

func (s step) String() string {
	switch s.kind {
	case "charge":
		return fmt.Sprintf("charge %s/%s %d order=%q faults=%q", s.tenant, s.key, s.amount, s.order, s.faults)
	case "lose":
		return fmt.Sprintf("the ledger loses the next %d answers", s.lose)
	case "advance":
		return fmt.Sprintf("advance %s", s.advance)
	case "window":
		return fmt.Sprintf("the window passes for %s/%s", s.tenant, s.key)
	case "restart", "reset":
		return fmt.Sprintf("%s %+v", s.kind, s.region)
	}
	return s.kind
}

func randomStep(rng *rand.Rand) step {
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	switch n := rng.IntN(100); {
	case n < 70:
		s := step{kind: "charge", tenant: pick(stepTenants()...), key: pick(stepKeys()...), amount: []int64{100, 250}[rng.IntN(2)]}
		if rng.IntN(8) == 0 {
			s.order = "order-1" // the ledger refuses a second charge of one order
		}
		switch rng.IntN(12) {
		case 0:
			s.faults.Point = lab.FaultCrashAfterClaim
		case 1:
			s.faults.Point = lab.FaultCrashAfterCharge
		case 2:
			s.faults = lab.Faults{Point: lab.FaultCrashAfterCharge, Confine: "m-"}
		case 3:
			s.faults.Point = lab.FaultOutboxFail
		case 4:
			s.faults = lab.Faults{Point: lab.FaultExpired, Retention: time.Second}
		}
		return s
	case n < 76:
		return step{kind: "lose", lose: []int32{1, 3}[rng.IntN(2)]} // within the request's own retries, or past them
	case n < 84:
		return step{kind: "window", tenant: pick(stepTenants()...), key: pick(stepKeys()...)}
	case n < 88:
		return step{kind: "advance", advance: []time.Duration{1500 * time.Millisecond, 10 * time.Minute, 61 * time.Minute}[rng.IntN(3)]}
	case n < 93:
		return step{kind: "restart", region: lab.Region{Namespace: lab.Namespace(pick("", "a", "b")), KeyPrefix: pick("", "m-")}}
	case n < 96:
		return step{kind: "reset", region: lab.Region{Namespace: lab.Namespace(pick("", "a", "b"))}}
	}
	return step{kind: "sweep"}
}

// do plays s and reads what the store and the ledger show after it.
func (w *twin) do(t *testing.T, s step) view {
	t.Helper()
	ctx := context.Background()
	var v view
	switch s.kind {
	case "charge":
		req := lab.ChargeRequest{Account: "acct-1", AmountCents: s.amount, Currency: "USD", OrderID: s.order}
		out, err := w.store.Charge(ctx, lab.Attempt{
			Scope:   lab.Scope{Namespace: lab.NamespaceOf(s.tenant), Tenant: s.tenant, Endpoint: lab.Endpoint, Key: s.key},
			Request: req, Fingerprint: req.Fingerprint(), Store: memory.Name, Run: "equal", Faults: s.faults,
		})
		if err != nil {
			v.Answer = w.named("error " + err.Error())
		} else {
			v.Answer = w.named(fmt.Sprintf("%d replayed=%v %s", out.Response.Status, out.Replayed, out.Response.Body))
		}
	case "lose":
		w.failures.Store(s.lose)
	case "advance":
		w.clock.Advance(s.advance)
	case "window":
		sc := lab.Scope{Namespace: lab.NamespaceOf(s.tenant), Tenant: s.tenant, Endpoint: lab.Endpoint, Key: s.key}
		v.Answer = fmt.Sprint(w.store.MakeHappen(ctx, sc, lab.EventWindow))
	case "restart":
		v.Answer = fmt.Sprint(w.store.Restart(ctx, s.region))
	case "reset":
		v.Answer = fmt.Sprint(w.store.Reset(ctx, s.region.Namespace))
	case "sweep":
		n, err := w.store.Sweep(ctx)
		v.Answer = fmt.Sprint(n, err)
	}
	must := func(err error) {
		if err != nil {
			t.Fatalf("reading the store or the ledger: %v", err)
		}
	}
	for _, tenant := range stepTenants() {
		for _, key := range stepKeys() {
			sc := lab.Scope{Namespace: lab.NamespaceOf(tenant), Tenant: tenant, Endpoint: lab.Endpoint, Key: key}
			k, err := w.store.Lookup(ctx, sc)
			must(err)
			in, err := w.store.Inspect(ctx, sc)
			must(err)
			for i, fact := range in.Facts {
				in.Facts[i] = w.named(fact)
			}
			v.Inspect = append(v.Inspect, in)
			tally, err := w.books.KeyCharges(ctx, tenant, memory.Name, key)
			must(err)
			for i, id := range tally.IDs {
				tally.IDs[i] = w.named(id)
			}
			v.Lookups, v.Tallies = append(v.Lookups, w.namedKeys(k)...), append(v.Tallies, tally)
		}
	}
	for _, ns := range []lab.Namespace{"a", "b"} {
		keys, total, err := w.store.Keys(ctx, ns, 3)
		must(err)
		v.Newest, v.Totals = append(v.Newest, w.namedKeys(keys...)), append(v.Totals, total)
	}
	// Across namespaces the newest keys of one instant come in no set
	// order: compare them all, sorted.
	keys, total, err := w.store.Keys(ctx, "", 100)
	must(err)
	slices.SortFunc(keys, func(x, y lab.KeyState) int {
		return cmp.Or(y.CreatedAt.Compare(x.CreatedAt), cmp.Compare(x.Tenant, y.Tenant), cmp.Compare(x.Key, y.Key))
	})
	v.Every, v.Totals, v.Len = w.namedKeys(keys...), append(v.Totals, total), w.store.Len()
	v.Oldest, err = w.store.OldestInFlight(ctx)
	must(err)
	v.Summary, err = w.books.Summary(ctx, "")
	must(err)
	v.Outbox, err = w.books.OutboxStats(ctx, "")
	must(err)
	return v
}

// namedKeys is keys with the charge ids in their stored responses named.
func (w *twin) namedKeys(keys ...lab.KeyState) []lab.KeyState {
	for i := range keys {
		if keys[i].Response != nil {
			keys[i].Response = []byte(w.named(string(keys[i].Response)))
		}
	}
	return keys
}

// chargeID matches the lab's charge ids.
var chargeID = regexp.MustCompile(`ch_[0-9a-f-]{36}`)

// named replaces each charge id by the order it first appeared in.
func (w *twin) named(s string) string {
	return chargeID.ReplaceAllStringFunc(s, func(id string) string {
		if n, ok := w.ids[id]; ok {
			return n
		}
		n := fmt.Sprintf("charge#%d", len(w.ids)+1)
		w.ids[id] = n
		return n
	})
}
