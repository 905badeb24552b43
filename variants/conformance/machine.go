package conformance

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

// The state machine's store parameters and clock jumps. Counted in 10 s,
// a key lives 6 (claim) or 360 (record) and the jumps are 7 and 366: no sum
// of jumps equals a lifetime, so no key ever sits exactly on its expiry
// (where the stores may round either way), and the seconds of wall clock
// the embedded Redis also counts are far from any boundary.
const (
	machineWindow   = time.Hour
	machineClaimTTL = time.Minute
	// The bounded wait: short on Redis, where every retry on a stale claim
	// sits it out before its 409; longer elsewhere, where it only bounds
	// twins and the new connections a PostgreSQL restart forces.
	machineRedisWait = 100 * time.Millisecond
	machineWait      = 2 * time.Second
	jumpPastClaim    = 70 * time.Second // stale claims expire, completed keys stay
	jumpPastWindow   = 61 * time.Minute // every key expires
)

// Each check owns two namespaces, "a" (tenants a and a~2, its second
// tenant) and "b", with two keys per tenant and two requests per key.
func machineRoles() []string  { return []string{"a", "a" + lab.SecondTenantSuffix, "b"} }
func machineKeys() []string   { return []string{"k0", "k1"} }
func machineAmounts() []int64 { return []int64{100, 250} } // two requests, two fingerprints

// profile is what the model needs to know of a design.
type profile struct {
	crash          variant.CrashEffect // declared by the design
	races          bool                // concurrent twins each charge (declared: retries break)
	restartForgets bool                // a restart loses the namespace's keys (declared: store_restart breaks)
	expiryForgets  bool                // past its retention a key is new again (declared: expired breaks)
	canJump        bool                // the clock the keys expire by can be moved
}

// profileOf reads the design's declaration and refuses one the model
// cannot describe.
func profileOf(t *testing.T, b backend) profile {
	t.Helper()
	effect := b.v.Crash // NewRegistry holds a keyed design to declaring one
	declared := func(c variant.Case) lab.Verdict { return promised(t, b.v, c, lab.Faults{}) }
	// Promises the model takes for granted of every keyed design, when no
	// two attempts of a tenant overlap (the twins step is the one that
	// overlaps them, and reads races).
	for _, c := range []variant.Case{variant.CaseReused, variant.CaseTenants,
		variant.FaultCase(lab.FaultCrashAfterClaim), variant.FaultCase(lab.FaultOutboxFail)} {
		if v := oneAtATime(t, b.v, c, lab.Faults{}); v != lab.Holds {
			t.Fatalf("%s declares %s for %s; the model assumes it holds", b.v.Name, v, c)
		}
	}
	if breaks := declared(variant.FaultCase(lab.FaultCrashAfterCharge)) == lab.Breaks; breaks != (effect != variant.CrashRollsBack && effect != variant.CrashLeavesLease && effect != variant.CrashLeavesRecoveryPoint) {
		t.Fatalf("%s declares crash_after_charge %s, which its crash effect in the model contradicts", b.v.Name, declared(variant.FaultCase(lab.FaultCrashAfterCharge)))
	}
	return profile{
		crash:          effect,
		races:          racesTwins(t, b.v),
		restartForgets: declared(variant.FaultCase(lab.FaultStoreRestart)) == lab.Breaks,
		expiryForgets:  declared(variant.FaultCase(lab.FaultExpired)) == lab.Breaks,
		canJump:        b.redis != redisReal, // a real Redis server's TTLs run on its own clock
	}
}

// slot is one (tenant, key) of a check: one idempotency scope.
type slot struct{ role, key string }

func (s slot) String() string { return s.role + "/" + s.key }

// keyState is the model of one key.
type keyState int

const (
	absent    keyState = iota // no live record: the next attempt is first
	completed                 // a live record with the response the client saw
	unseen                    // committed, with a response not yet seen: lost with a crash, or one of racing twins'
	claimed                   // a stale claim: its request waits (409), another gets 422
	// held and resumable are a key stopped at a recovery point after its
	// charge (phases): locked until its lock ends (409), then resumed by
	// its request's next attempt, which finishes it with that charge.
	held
	resumable
)

func (s keyState) String() string {
	return [...]string{"absent", "completed", "unseen", "claimed", "held", "resumable"}[s]
}

type modelKey struct {
	state   keyState
	amount  int64 // the request the live state belongs to
	resp    lab.Response
	expires time.Time // on the model's clock
	charges int       // the ledger, over every life of the key
	cents   int64
	phase   int // held, resumable: the last phase committed
}

type machine struct {
	e      *env
	p      profile
	prefix string // of the check's tenant names
	slots  []slot
	keys   map[slot]*modelKey
	dirty  map[slot]bool // keys to check after the step
}

// stateMachine interleaves charges, retries, concurrent twins, crashes,
// outbox failures, restarts and clock jumps at random, and checks the store
// on backend b against a model of what it promises. After every step the ledger holds
// exactly the charges the model predicts (so never a second charge for a
// live key where the design holds), every replay is the first response
// byte for byte, and another request on a live key gets 422 and charges
// nothing. The model forgets keys only where the design declares a break —
// on restart, on crash_after_charge, past the window — and only in the
// namespace that restarted or crashed; and it counts a charge per twin only
// where the design declares that concurrent retries break.
func stateMachine(t *testing.T, b backend) {
	p := profileOf(t, b)
	svc := startServices(t, b)
	wait := machineWait
	if b.redis != "" || p.crash == variant.CrashLeavesLease {
		wait = machineRedisWait // every retry on a stale claim sits the wait out
	}
	var n atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		i := n.Add(1)
		m := &machine{
			e:      svc.open(rt, settings{window: machineWindow, wait: wait, claimTTL: machineClaimTTL, prefix: fmt.Sprintf("c%d:", i)}),
			p:      p,
			prefix: fmt.Sprintf("n%d", i), // each check its own tenants, on shared servers
			keys:   map[slot]*modelKey{},
			dirty:  map[slot]bool{},
		}
		for _, r := range machineRoles() {
			for _, k := range machineKeys() {
				m.slots = append(m.slots, slot{r, k})
				m.keys[slot{r, k}] = &modelKey{}
			}
		}
		rt.Repeat(m.actions())
		m.touch("")
		m.check(rt)
	})
}

func (m *machine) actions() map[string]func(*rapid.T) {
	roles := rapid.SampledFrom(machineRoles())
	keys := rapid.SampledFrom(machineKeys())
	amounts := rapid.SampledFrom(machineAmounts())
	draw := func(t *rapid.T) slot { return slot{roles.Draw(t, "tenant"), keys.Draw(t, "key")} }
	acts := map[string]func(*rapid.T){
		"": m.check,
		"charge": func(t *rapid.T) {
			m.attempt(t, draw(t), amounts.Draw(t, "amount"), lab.Faults{})
		},
		"retry": func(t *rapid.T) {
			var live []slot
			for _, s := range m.slots {
				if m.keys[s].state != absent {
					live = append(live, s)
				}
			}
			if len(live) == 0 {
				t.Skip("no live key to retry")
			}
			s := rapid.SampledFrom(live).Draw(t, "live key")
			m.attempt(t, s, m.keys[s].amount, lab.Faults{})
		},
		"twins": func(t *rapid.T) {
			m.twins(t, draw(t), amounts.Draw(t, "amount"), rapid.IntRange(2, 4).Draw(t, "twins"))
		},
		"fault": func(t *rapid.T) {
			f := rapid.SampledFrom(m.faults()).Draw(t, "fault")
			m.attempt(t, draw(t), amounts.Draw(t, "amount"), f)
		},
	}
	if r, ok := m.e.store.(lab.Restarter); ok {
		acts["restart"] = func(t *rapid.T) {
			// One namespace's restart, or every namespace's (the admin's).
			m.restart(t, r, rapid.SampledFrom([]string{"a", "b", ""}).Draw(t, "namespace"))
		}
	}
	if m.p.canJump {
		acts["jumpPastClaimTTL"] = func(t *rapid.T) { m.jump(t, jumpPastClaim) }
		acts["jumpPastWindow"] = func(t *rapid.T) { m.jump(t, jumpPastWindow) }
	}
	return acts
}

// faults are the faults a first attempt may carry: on a design of
// phases, a crash after each of them too.
func (m *machine) faults() []lab.Faults {
	fs := []lab.Faults{{Point: lab.FaultCrashAfterClaim}, {Point: lab.FaultCrashAfterCharge}, {Point: lab.FaultOutboxFail}}
	if m.p.crash == variant.CrashLeavesRecoveryPoint {
		fs = append(fs, lab.Faults{Point: lab.FaultCrashAfterPhase, Phase: 2}, lab.Faults{Point: lab.FaultCrashAfterPhase, Phase: 3})
	}
	return fs
}

func (m *machine) tenant(s slot) string { return m.prefix + s.role }

func (m *machine) scope(s slot) lab.Scope {
	return lab.Scope{Namespace: lab.NamespaceOf(m.tenant(s)), Tenant: m.tenant(s), Endpoint: lab.Endpoint, Key: s.key}
}

// namespace is a role's namespace ("" for every namespace).
func (m *machine) namespace(role string) lab.Namespace {
	if role == "" {
		return ""
	}
	return lab.NamespaceOf(m.prefix + role)
}

func (k *modelKey) charge(amount int64) {
	k.charges++
	k.cents += amount
}

// live sets a key's state, keeping its ledger figures.
func (m *machine) live(k *modelKey, s keyState, amount int64, resp lab.Response, ttl time.Duration) {
	k.state, k.amount, k.resp, k.expires = s, amount, resp, m.e.clock.Now().Add(ttl)
}

// forget loses a namespace's keys ("" for every namespace's).
func (m *machine) forget(ns lab.Namespace) {
	for _, s := range m.slots {
		if ns.Includes(lab.NamespaceOf(m.tenant(s))) {
			m.keys[s].state = absent
			m.dirty[s] = true
		}
	}
}

// attempt sends one attempt and checks its answer against the model.
func (m *machine) attempt(t *rapid.T, s slot, amount int64, f lab.Faults) {
	k := m.keys[s]
	m.dirty[s] = true
	point := f.Point
	a := m.e.attempt(m.tenant(s), s.key, amount, "", f)
	out, err := m.e.charge(t, a)
	t.Logf("%s %d %s (key %s): %s", s, amount, f, k.state, describe(out, err))
	switch {
	case k.state != absent && k.amount != amount:
		if !errors.Is(err, lab.ErrKeyReused) {
			t.Fatalf("another request on a live key: %s; want ErrKeyReused (422)", describe(out, err))
		}
	case k.state == completed:
		if err != nil || !out.Replayed || out.Response.Status != k.resp.Status || string(out.Response.Body) != string(k.resp.Body) {
			t.Fatalf("retry of a completed key: %s; want a replay of %d %s", describe(out, err), k.resp.Status, k.resp.Body)
		}
	case k.state == unseen:
		m.learn(t, k, []lab.Outcome{out}, []error{err})
	case k.state == claimed || k.state == held:
		if !errors.Is(err, lab.ErrInProgress) {
			t.Fatalf("retry on a locked key (%s): %s; want 409 in progress", k.state, describe(out, err))
		}
	case m.p.crash == variant.CrashLeavesRecoveryPoint:
		m.phases(t, k, amount, f, out, err)
	case point == lab.FaultNone:
		m.charged(t, k, amount, out, err)
	case point == lab.FaultOutboxFail: // every keyed design declares that this holds
		if !errors.Is(err, lab.ErrOutboxWrite) {
			t.Fatalf("%s: %s; want the injected outbox failure, and the key released", point, describe(out, err))
		}
	default: // a first attempt that crashes
		if !errors.Is(err, lab.ErrCrash) {
			t.Fatalf("%s: %s; want the injected crash", point, describe(out, err))
		}
		charged := point == lab.FaultCrashAfterCharge
		if charged {
			k.charge(amount)
		}
		switch m.p.crash {
		case variant.CrashWipesHeap:
			m.forget(lab.NamespaceOf(m.tenant(s)))
		case variant.CrashLeavesClaim:
			m.live(k, claimed, amount, lab.Response{}, machineClaimTTL)
		case variant.CrashRollsBack:
			if charged {
				m.live(k, unseen, amount, lab.Response{}, machineWindow)
			}
		case variant.CrashLeavesLease:
			if charged {
				m.live(k, unseen, amount, lab.Response{}, machineWindow)
			} else {
				m.live(k, claimed, amount, lab.Response{}, machineClaimTTL)
			}
		}
	}
}

// phases checks an attempt on a design of phases that runs the phases its
// key has left (all four when it is absent): it crashes after the phase
// its fault names, if it runs that phase; it stops before phase four when
// the outbox fails, the lock let go; otherwise it finishes with a fresh
// 201 of the key's one charge.
func (m *machine) phases(t *rapid.T, k *modelKey, amount int64, f lab.Faults, out lab.Outcome, err error) {
	from := 0
	if k.state == resumable {
		from = k.phase
	}
	crash := map[lab.FaultPoint]int{lab.FaultCrashAfterClaim: 1, lab.FaultCrashAfterCharge: 4, lab.FaultCrashAfterPhase: f.Phase}[f.Point]
	stop := 4
	switch {
	case crash > from:
		stop = crash
		if !errors.Is(err, lab.ErrCrash) {
			t.Fatalf("%s from phase %d: %s; want the injected crash", f, from, describe(out, err))
		}
	case f.Point == lab.FaultOutboxFail:
		stop = 3
		if !errors.Is(err, lab.ErrOutboxWrite) {
			t.Fatalf("%s from phase %d: %s; want the injected outbox failure", f, from, describe(out, err))
		}
	}
	if from < 2 && stop >= 2 {
		k.charge(amount)
	}
	switch {
	case stop == 4 && crash == 4:
		m.live(k, unseen, amount, lab.Response{}, machineWindow)
	case stop == 4:
		if err != nil || out.Replayed {
			t.Fatalf("attempt from phase %d: %s; want a fresh 201", from, describe(out, err))
		}
		if c := chargeBody(t, out.Response); c.AmountCents != amount {
			t.Fatalf("charged %d, want %d", c.AmountCents, amount)
		}
		m.live(k, completed, amount, out.Response, machineWindow)
	case stop == 1:
		m.live(k, claimed, amount, lab.Response{}, machineClaimTTL)
	case f.Point == lab.FaultOutboxFail:
		m.live(k, resumable, amount, lab.Response{}, 0) // let go at once
		k.phase = stop
	default:
		m.live(k, held, amount, lab.Response{}, machineClaimTTL)
		k.phase = stop
	}
}

// charged checks a first attempt's fresh 201 and records it.
func (m *machine) charged(t *rapid.T, k *modelKey, amount int64, out lab.Outcome, err error) {
	if err != nil || out.Replayed {
		t.Fatalf("first attempt: %s; want a fresh 201", describe(out, err))
	}
	if c := chargeBody(t, out.Response); c.AmountCents != amount {
		t.Fatalf("charged %d, want %d", c.AmountCents, amount)
	}
	k.charge(amount)
	m.live(k, completed, amount, out.Response, machineWindow)
}

// learn checks the replays of a charge whose response the client never
// saw: all the same 201 for the request, which the key then keeps.
func (m *machine) learn(t *rapid.T, k *modelKey, outs []lab.Outcome, errs []error) {
	for i, out := range outs {
		if errs[i] != nil || !out.Replayed || out.Response.Status != http.StatusCreated {
			t.Fatalf("retry after a lost response: %s; want a replay of the committed charge", describe(out, errs[i]))
		}
		if c := chargeBody(t, out.Response); c.AmountCents != k.amount {
			t.Fatalf("replayed a charge of %d, want %d", c.AmountCents, k.amount)
		}
		if string(out.Response.Body) != string(outs[0].Response.Body) {
			t.Fatalf("two replays differ: %s and %s", outs[0].Response.Body, out.Response.Body)
		}
	}
	k.state, k.resp = completed, outs[0].Response
}

// twins releases n copies of one request together.
func (m *machine) twins(t *rapid.T, s slot, amount int64, n int) {
	k := m.keys[s]
	m.dirty[s] = true
	a := m.e.attempt(m.tenant(s), s.key, amount, "", lab.Faults{})
	outs, errs := make([]lab.Outcome, n), make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			outs[i], errs[i] = m.e.charge(t, a)
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		t.Logf("%s %d twin %d/%d (key %s): %s", s, amount, i+1, n, k.state, describe(outs[i], errs[i]))
	}
	switch {
	case k.state != absent && k.amount != amount:
		for i := range n {
			if !errors.Is(errs[i], lab.ErrKeyReused) {
				t.Fatalf("twin with another request on a live key: %s; want ErrKeyReused", describe(outs[i], errs[i]))
			}
		}
	case k.state == completed:
		for i := range n {
			if errs[i] != nil || !outs[i].Replayed || string(outs[i].Response.Body) != string(k.resp.Body) || outs[i].Response.Status != k.resp.Status {
				t.Fatalf("twin on a completed key: %s; want a replay of %s", describe(outs[i], errs[i]), k.resp.Body)
			}
		}
	case k.state == unseen:
		m.learn(t, k, outs, errs)
	case k.state == claimed || k.state == held:
		for i := range n {
			if !errors.Is(errs[i], lab.ErrInProgress) {
				t.Fatalf("twin on a locked key (%s): %s; want 409 in progress", k.state, describe(outs[i], errs[i]))
			}
		}
	case m.p.races:
		// Nothing marked the key taken: every twin looked before any wrote,
		// and each charged. The key keeps one of their answers, which the
		// next retry shows.
		for i := range n {
			if errs[i] != nil || outs[i].Replayed {
				t.Fatalf("twin on a design whose twins race: %s; want a fresh 201", describe(outs[i], errs[i]))
			}
			if c := chargeBody(t, outs[i].Response); c.AmountCents != amount {
				t.Fatalf("twin charged %d, want %d", c.AmountCents, amount)
			}
			k.charge(amount)
		}
		m.live(k, unseen, amount, lab.Response{}, machineWindow)
	default: // one of them is first; the others replay it or give up waiting
		first := -1
		for i := range n {
			if errs[i] == nil && !outs[i].Replayed {
				first = i
			}
		}
		if first < 0 {
			t.Fatal("no twin charged")
		}
		if k.state == resumable { // the first resumed the key: its charge was made before
			k.charges--
			k.cents -= amount
		}
		m.charged(t, k, amount, outs[first], errs[first])
		for i := range n {
			switch {
			case i == first, errors.Is(errs[i], lab.ErrInProgress):
			case errs[i] != nil || !outs[i].Replayed:
				t.Fatalf("twin: %s; want a replay of the first or 409 (one charge)", describe(outs[i], errs[i]))
			case string(outs[i].Response.Body) != string(k.resp.Body):
				t.Fatalf("twin replayed %s, want the first's %s", outs[i].Response.Body, k.resp.Body)
			}
		}
	}
}

func (m *machine) restart(t *rapid.T, r lab.Restarter, role string) {
	ns := m.namespace(role)
	if err := r.Restart(t.Context(), lab.Region{Namespace: ns}); err != nil {
		t.Fatalf("restart of %q: %v", ns, err)
	}
	t.Logf("restart of namespace %q", ns)
	m.touch(role)
	if m.p.restartForgets {
		m.forget(ns)
	}
}

// jump moves the clock the keys expire by: the lab's, and the embedded
// Redis server's.
func (m *machine) jump(t *rapid.T, d time.Duration) {
	m.e.clock.Advance(d)
	if m.e.svc.mr != nil {
		m.e.svc.mr.FastForward(d)
	}
	t.Logf("clock +%s", d)
	m.touch("")
	now := m.e.clock.Now()
	for _, k := range m.keys {
		if k.state == absent || k.state == resumable || now.Before(k.expires) {
			continue
		}
		switch {
		case k.state == held:
			k.state = resumable // the lock ended: the next attempt resumes
		case k.state == claimed || m.p.expiryForgets:
			k.state = absent
		}
	}
}

// touch marks a namespace's keys ("" every key) to check after the step.
func (m *machine) touch(role string) {
	ns := m.namespace(role)
	for _, s := range m.slots {
		if ns.Includes(lab.NamespaceOf(m.tenant(s))) {
			m.dirty[s] = true
		}
	}
}

// check compares the ledger, and the store's view of each key, with the
// model: after every step for the keys the step may have changed (reading
// every key after every step would dominate the run on PostgreSQL), and for
// every key at the end of the run.
func (m *machine) check(t *rapid.T) {
	for _, s := range m.slots {
		if !m.dirty[s] {
			continue
		}
		k := m.keys[s]
		got := m.e.tally(t, m.tenant(s), s.key)
		if got.Charges != k.charges || got.Cents != k.cents {
			t.Fatalf("ledger for %s holds %d charge(s), %d cents; the model expects %d, %d", s, got.Charges, got.Cents, k.charges, k.cents)
		}
		want := map[keyState]string{absent: lab.KeyAbsent, completed: lab.KeyCompleted, unseen: lab.KeyCompleted, claimed: lab.KeyInFlight,
			held: lab.KeyInFlight, resumable: lab.KeyInFlight}[k.state]
		if st, ok := m.e.lookup(t, m.scope(s)); ok && st != want {
			t.Fatalf("store reports key %s %s; the model has it %s", s, st, k.state)
		}
	}
	clear(m.dirty)
}
