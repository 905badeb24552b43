package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/variant"
)

const (
	window      = 24 * time.Hour
	claimTTL    = 30 * time.Second
	defaultWait = 5 * time.Second        // long enough that twins replay rather than give up
	shortWait   = 150 * time.Millisecond // the bounded wait of the 409 scenario
	shortTTL    = 300 * time.Millisecond // a claim TTL or key retention meant to run out
	pastShort   = time.Second            // how far elapse moves the clock past shortTTL
	slowWork    = 1500 * time.Millisecond
	twins       = 32
)

// scenario is one row of the conformance table.
type scenario struct {
	name string
	wait time.Duration // the store's bounded wait; defaultWait when 0
	run  func(t *testing.T, e *env)
}

// scenarios are the table's rows.
func scenarios() []scenario {
	return []scenario{
		{name: "FirstCharge", run: firstCharge},
		{name: "ConcurrentTwins", run: concurrentTwins},
		{name: "ReplayByteForByte", run: replayByteForByte},
		{name: "ReusedKeyAnotherRequest", run: reusedKey},
		{name: "RetryOnAnotherReplica", run: anotherReplica},
		{name: "InFlightTwinGets409", wait: shortWait, run: inFlightTwin},
		{name: "SlowWorkPastClaimTTL", run: slowWorkPastClaimTTL},
		{name: "CrashAfterClaim", run: crashAfter(lab.FaultCrashAfterClaim)},
		{name: "CrashAfterCharge", run: crashAfter(lab.FaultCrashAfterCharge)},
		{name: "OutboxFailure", run: outboxFailure},
		{name: "Restart", run: restart},
		{name: "Expiry", run: expiry},
		{name: "OrderIDOutlivesKey", run: orderIDOutlivesKey},
		{name: "TwoTenantsOneKey", run: twoTenants},
	}
}

// wantCharges fails unless the ledger holds n charges for the key.
func wantCharges(t *testing.T, e *env, tenant, key string, n int, why string) lab.KeyTally {
	t.Helper()
	k := e.tally(t, tenant, key)
	if k.Charges != n {
		t.Fatalf("ledger holds %d charge(s) for %s/%s, want %d: %s", k.Charges, tenant, key, n, why)
	}
	return k
}

// fresh fails unless the attempt charged: a first 201, not a replay.
func fresh(t *testing.T, what string, out lab.Outcome, err error) lab.Outcome {
	t.Helper()
	if err != nil || out.Replayed || out.Response.Status != http.StatusCreated {
		t.Fatalf("%s: %s; want a fresh 201", what, describe(out, err))
	}
	return out
}

// replayOf fails unless the attempt replayed want byte for byte.
func replayOf(t *testing.T, what string, want lab.Response, out lab.Outcome, err error) {
	t.Helper()
	if err != nil || !out.Replayed || out.Response.Status != want.Status || !bytes.Equal(out.Response.Body, want.Body) {
		t.Fatalf("%s: %s; want a replay of %d %s", what, describe(out, err), want.Status, want.Body)
	}
}

// bystander charges a key in another namespace ("globex"), and returns a
// check that it still replays: one namespace's crash or restart never
// touches another's keys, whatever the design.
func bystander(t *testing.T, e *env) func() {
	t.Helper()
	a := e.attempt("globex", "k-bystander", 4200, "", lab.Faults{})
	out, err := e.charge(t, a)
	first := fresh(t, "bystander in another namespace", out, err).Response
	return func() {
		t.Helper()
		out, err := e.charge(t, a)
		replayOf(t, "bystander in another namespace", first, out, err)
		wantCharges(t, e, "globex", "k-bystander", 1, "another namespace's crash or restart leaves its keys alone")
	}
}

func firstCharge(t *testing.T, e *env) {
	a := e.attempt("acme", "k-first", 2500, "", lab.Faults{})
	out, err := e.charge(t, a)
	fresh(t, "first charge", out, err)
	c := chargeBody(t, out.Response)
	if c.ID == "" || c.Account != "acct-1" || c.AmountCents != 2500 || c.Currency != "USD" || c.BalanceCents != 2500 {
		t.Fatalf("charge %+v, want 2500 USD on acct-1 with a balance of 2500", c)
	}
	if k := wantCharges(t, e, "acme", "k-first", 1, "one attempt"); k.Cents != 2500 {
		t.Fatalf("ledger holds %d cents, want 2500", k.Cents)
	}
	if st, ok := e.lookup(t, a.Scope); ok && st != lab.KeyCompleted {
		t.Fatalf("key state %s after the charge, want %s", st, lab.KeyCompleted)
	}
}

// concurrentTwins releases many copies of one request together.
func concurrentTwins(t *testing.T, e *env) {
	verdict := promised(t, e.b.v, variant.CaseRetries, lab.Faults{})
	a := e.attempt("acme", "k-twins", 2500, "", lab.Faults{})
	type answer struct {
		out lab.Outcome
		err error
	}
	answers := make([]answer, twins)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			<-start
			out, err := e.charge(t, a)
			answers[i] = answer{out, err}
		})
	}
	close(start)
	wg.Wait()
	k := e.tally(t, "acme", "k-twins")
	if verdict == lab.Breaks {
		if k.Charges < 2 {
			t.Fatalf("ledger holds %d charge(s); the variant declares that concurrent retries break", k.Charges)
		}
		return
	}
	if k.Charges != 1 {
		t.Fatalf("ledger holds %d charges after %d concurrent twins, want 1", k.Charges, twins)
	}
	var first *lab.Response
	for _, an := range answers {
		if an.err == nil && !an.out.Replayed {
			if first != nil {
				t.Fatalf("two twins got a fresh answer: %s and %s", first.Body, an.out.Response.Body)
			}
			first = &an.out.Response
		}
	}
	if first == nil {
		t.Fatal("no twin got the fresh answer")
	}
	chargeBody(t, *first)
	replays, busy := 0, 0
	for _, an := range answers {
		switch {
		case errors.Is(an.err, lab.ErrInProgress):
			busy++
		case an.err != nil:
			t.Errorf("twin: %v", an.err)
		case an.out.Replayed:
			replayOf(t, "twin", *first, an.out, an.err)
			replays++
		}
	}
	t.Logf("1 charge, %d replays, %d in progress", replays, busy)
}

func replayByteForByte(t *testing.T, e *env) {
	verdict := promised(t, e.b.v, variant.CaseRetries, lab.Faults{})
	a := e.attempt("acme", "k-replay", 1999, "order-replay", lab.Faults{})
	out, err := e.charge(t, a)
	first := fresh(t, "first", out, err).Response
	for range 3 {
		retry := a
		retry.Replica = "another-replica" // not part of the request: still a retry
		out, err := e.charge(t, retry)
		if verdict == lab.Holds {
			replayOf(t, "retry", first, out, err)
		}
	}
	wantCharges(t, e, "acme", "k-replay", 1, "retries replay the first response")
}

func reusedKey(t *testing.T, e *env) {
	verdict := promised(t, e.b.v, variant.CaseReused, lab.Faults{})
	a := e.attempt("acme", "k-reused", 2500, "", lab.Faults{})
	out, err := e.charge(t, a)
	first := fresh(t, "first", out, err).Response
	for _, other := range []lab.Attempt{
		e.attempt("acme", "k-reused", 9999, "", lab.Faults{}),            // another amount
		e.attempt("acme", "k-reused", 2500, "order-other", lab.Faults{}), // another order
	} {
		out, err := e.charge(t, other)
		if verdict == lab.Holds && !errors.Is(err, lab.ErrKeyReused) {
			t.Fatalf("another request under the key: %s; want ErrKeyReused (422)", describe(out, err))
		}
	}
	if verdict == lab.Breaks {
		if k := e.tally(t, "acme", "k-reused"); k.Charges < 2 {
			t.Fatalf("ledger holds %d charge(s); the variant declares that a reused key is charged", k.Charges)
		}
		return
	}
	if k := wantCharges(t, e, "acme", "k-reused", 1, "a reused key charges nothing"); k.Cents != 2500 {
		t.Fatalf("ledger holds %d cents, want the first request's 2500 only", k.Cents)
	}
	out, err = e.charge(t, a)
	replayOf(t, "the first request again", first, out, err)
}

// anotherReplica: the retry reaches another replica of the server.
func anotherReplica(t *testing.T, e *env) {
	verdict := promised(t, e.b.v, variant.CaseReplicas, lab.Faults{})
	a := e.attempt("acme", "k-replicas", 2500, "", lab.Faults{})
	out, err := e.charge(t, a)
	first := fresh(t, "first, on replica 1", out, err).Response
	retry := a
	retry.Replica = "r2"
	out, err = e.replica(t).Charge(t.Context(), retry)
	if verdict == lab.Holds {
		replayOf(t, "retry on replica 2", first, out, err)
	} else {
		fresh(t, "retry on replica 2, which has its own keys", out, err)
	}
	wantCharges(t, e, "acme", "k-replicas", verdictCharges(verdict), "declared verdict for replicas: "+string(verdict))
}

// inFlightTwin: a twin of a request still working gets 409 after the
// bounded wait, and charges nothing. On a design whose twins race nothing
// holds the twin back: it charges beside the owner, and its answer is the
// key's.
func inFlightTwin(t *testing.T, e *env) {
	races := racesTwins(t, e.b.v)
	owner := e.attempt("acme", "k-busy", 2500, "", lab.Faults{Point: lab.FaultSlow, Work: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := e.store.Charge(ctx, owner)
		done <- err
	}()
	if !races { // a racing owner holds nothing to wait for
		e.waitInFlight(t, owner.Scope)
	}
	twin := owner
	twin.Faults = lab.Faults{}
	began := time.Now()
	out, err := e.charge(t, twin)
	took := time.Since(began)
	var ip *lab.InProgressError
	switch {
	case races:
		fresh(t, "twin of an attempt in flight, on a design whose twins race", out, err)
		wantCharges(t, e, "acme", "k-busy", 1, "the twin charged while the owner still works")
	case !errors.As(err, &ip) || ip.RetryAfter <= 0:
		t.Fatalf("twin of an attempt in flight: %s; want 409 in progress with a Retry-After", describe(out, err))
	case took > shortWait+5*time.Second:
		t.Fatalf("the twin waited %s; the bounded wait is %s", took, shortWait)
	default:
		wantCharges(t, e, "acme", "k-busy", 0, "the owner is still working and the twin gave up")
	}
	racer := out.Response
	// The owner's client leaves: its work is interrupted, it charges
	// nothing, and the key is free for the next attempt (or holds the
	// racing twin's answer).
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("interrupted owner: %v, want context canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the interrupted owner never returned")
	}
	if races {
		wantCharges(t, e, "acme", "k-busy", 1, "the interrupted owner charged nothing")
		out, err = e.charge(t, twin)
		replayOf(t, "retry after the owner gave up", racer, out, err)
		return
	}
	wantCharges(t, e, "acme", "k-busy", 0, "the interrupted owner charged nothing")
	out, err = e.charge(t, twin)
	fresh(t, "retry after the owner gave up", out, err)
	wantCharges(t, e, "acme", "k-busy", 1, "one attempt completed")
}

// slowWorkPastClaimTTL: a twin arrives once the owner's claim TTL has run
// out on the store's clock, while the owner still works. A claim that lives
// as long as the work holds; a lock TTL shorter than the work breaks.
func slowWorkPastClaimTTL(t *testing.T, e *env) {
	f := lab.Faults{Point: lab.FaultSlow, Work: slowWork, ClaimTTL: shortTTL}
	want := verdictCharges(promised(t, e.b.v, variant.FaultCase(lab.FaultSlow), f))
	owner := e.attempt("acme", "k-slow", 2500, "", f)
	type answer struct {
		out lab.Outcome
		err error
	}
	done := make(chan answer, 1)
	go func() {
		out, err := e.store.Charge(t.Context(), owner)
		done <- answer{out, err}
	}()
	if !racesTwins(t, e.b.v) { // a racing owner holds nothing to wait for
		e.waitInFlight(t, owner.Scope)
	}
	e.elapse(t, pastShort, owner.Scope)
	twin := owner
	twin.Faults = lab.Faults{}
	tout, terr := e.charge(t, twin)
	own := <-done
	switch {
	case want == 1 && errors.Is(terr, lab.ErrInProgress):
		fresh(t, "slow owner", own.out, own.err)
	case want == 1 && own.out.Replayed:
		// Fencing: the twin took over with the next token and charged; the
		// ledger refused the slow owner's stale write, which answers with
		// the twin's charge.
		fresh(t, "twin after the lease ran out", tout, terr)
		replayOf(t, "the fenced slow owner", tout.Response, own.out, own.err)
	case want == 1:
		fresh(t, "slow owner", own.out, own.err)
		replayOf(t, "twin of the slow owner", own.out.Response, tout, terr)
	default:
		fresh(t, "slow owner", own.out, own.err)
		fresh(t, "twin after the claim expired", tout, terr)
	}
	wantCharges(t, e, "acme", "k-slow", want, "declared verdict for slow work with claim TTL "+shortTTL.String()+" < work "+slowWork.String())
}

// retryUntilAnswered is a client retrying after a lost response: on 409 it
// lets the stale claim's TTL run out and retries, a bounded number of times.
func retryUntilAnswered(t *testing.T, e *env, a lab.Attempt) lab.Outcome {
	t.Helper()
	for try := 0; ; try++ {
		out, err := e.charge(t, a)
		if !errors.Is(err, lab.ErrInProgress) {
			if err != nil || (out.Response.Status != http.StatusCreated) {
				t.Fatalf("retry: %s; want 201", describe(out, err))
			}
			return out
		}
		if try == 3 {
			t.Fatalf("still in progress after %d retries", try+1)
		}
		e.elapse(t, pastShort, a.Scope)
	}
}

// crashAfter: the process dies at point, the client retries until it is
// answered, then retries once more. The ledger must hold what the variant
// declares for that fault.
func crashAfter(point lab.FaultPoint) func(t *testing.T, e *env) {
	return func(t *testing.T, e *env) {
		f := lab.Faults{Point: point, ClaimTTL: shortTTL}
		verdict := oneAtATime(t, e.b.v, variant.FaultCase(point), f)
		key := "k-" + string(point)
		untouched := bystander(t, e)
		a := e.attempt("acme", key, 2500, "", f)
		out, err := e.charge(t, a)
		if !errors.Is(err, lab.ErrCrash) {
			t.Fatalf("crashing attempt: %s; want the injected crash", describe(out, err))
		}
		charged := 0
		if point == lab.FaultCrashAfterCharge {
			charged = 1
		}
		wantCharges(t, e, "acme", key, charged, "what the crashed attempt committed")
		retry := a
		retry.Faults = lab.Faults{}
		first := retryUntilAnswered(t, e, retry)
		out, err = e.charge(t, retry)
		replayOf(t, "retry after the answered one", first.Response, out, err)
		want := verdictCharges(verdict)
		if point == lab.FaultCrashAfterCharge {
			// Holding means the retry replays the charge the crash hid;
			// breaking means it charges again.
			if (want == 1) != first.Replayed {
				t.Fatalf("retry after the lost response: %s; the variant declares %s", describe(first, nil), verdict)
			}
		}
		wantCharges(t, e, "acme", key, want, "declared verdict for "+string(point)+": "+string(verdict))
		untouched()
	}
}

func outboxFailure(t *testing.T, e *env) {
	f := lab.Faults{Point: lab.FaultOutboxFail}
	verdict := oneAtATime(t, e.b.v, variant.FaultCase(lab.FaultOutboxFail), f)
	a := e.attempt("acme", "k-outbox", 2500, "", f)
	out, err := e.charge(t, a)
	if !errors.Is(err, lab.ErrOutboxWrite) {
		t.Fatalf("attempt with a failing outbox: %s; want the injected outbox failure", describe(out, err))
	}
	switch {
	case verdict == lab.Holds && e.b.v.Crash == variant.CrashLeavesRecoveryPoint:
		wantCharges(t, e, "acme", "k-outbox", 1, "the phases before the failed one committed the charge, which the retry resumes")
	case verdict == lab.Holds:
		wantCharges(t, e, "acme", "k-outbox", 0, "the failed write rolled the charge back")
	}
	retry := a
	retry.Faults = lab.Faults{}
	out, err = e.charge(t, retry)
	first := fresh(t, "retry", out, err).Response
	out, err = e.charge(t, retry)
	replayOf(t, "second retry", first, out, err)
	wantCharges(t, e, "acme", "k-outbox", verdictCharges(verdict), "declared verdict for outbox_fail: "+string(verdict))
}

// restart: the store restarts between the charge and its retry, in the
// namespace of the charge's tenant (what an attendee's store_restart does).
func restart(t *testing.T, e *env) {
	r, ok := e.store.(lab.Restarter)
	if !ok {
		t.Skipf("%s cannot restart", e.b.v.Name)
	}
	verdict := promised(t, e.b.v, variant.FaultCase(lab.FaultStoreRestart), lab.Faults{})
	untouched := bystander(t, e)
	a := e.attempt("acme", "k-restart", 2500, "", lab.Faults{})
	out, err := e.charge(t, a)
	first := fresh(t, "first", out, err).Response
	if err := r.Restart(t.Context(), lab.Region{Namespace: lab.NamespaceOf("acme")}); err != nil {
		t.Fatalf("restart: %v", err)
	}
	out, err = e.charge(t, a)
	if verdict == lab.Holds {
		replayOf(t, "retry after the restart", first, out, err)
	} else {
		fresh(t, "retry after the restart", out, err)
	}
	wantCharges(t, e, "acme", "k-restart", verdictCharges(verdict), "declared verdict for store_restart: "+string(verdict))
	untouched()
}

func expiry(t *testing.T, e *env) {
	f := lab.Faults{Retention: shortTTL}
	verdict := promised(t, e.b.v, variant.FaultCase(lab.FaultExpired), f)
	a := e.attempt("acme", "k-expiry", 2500, "", f)
	out, err := e.charge(t, a)
	first := fresh(t, "first", out, err).Response
	e.elapse(t, pastShort, a.Scope)
	if st, ok := e.lookup(t, a.Scope); ok && st != lab.KeyAbsent {
		t.Fatalf("key %s after its retention, want %s", st, lab.KeyAbsent)
	}
	late := a
	late.Faults = lab.Faults{}
	out, err = e.charge(t, late)
	if verdict == lab.Holds {
		replayOf(t, "late retry", first, out, err)
	} else {
		fresh(t, "late retry: a new operation", out, err)
	}
	wantCharges(t, e, "acme", "k-expiry", verdictCharges(verdict), "declared verdict for expired: "+string(verdict))
}

// orderIDOutlivesKey: past the key's retention the retry is a new
// operation, but the order id is a permanent domain key: the ledger refuses
// a second charge, and the 409 is stored and replayed like any response.
func orderIDOutlivesKey(t *testing.T, e *env) {
	a := e.attempt("acme", "k-order", 2500, "order-77", lab.Faults{Retention: shortTTL})
	out, err := e.charge(t, a)
	c := chargeBody(t, fresh(t, "first", out, err).Response)
	e.elapse(t, pastShort, a.Scope)
	late := a
	late.Faults = lab.Faults{}
	out, err = e.charge(t, late)
	if err != nil || out.Replayed || out.Response.Status != http.StatusConflict {
		t.Fatalf("late retry of a charged order: %s; want a fresh 409", describe(out, err))
	}
	var p lab.Problem
	if err := json.Unmarshal(out.Response.Body, &p); err != nil || p.Code != "order_already_charged" || p.ChargeID != c.ID || p.Status != http.StatusConflict {
		t.Fatalf("problem %s (%v), want order_already_charged naming %s", out.Response.Body, err, c.ID)
	}
	conflict := out.Response
	out, err = e.charge(t, late)
	replayOf(t, "retry of the stored 409", conflict, out, err)
	wantCharges(t, e, "acme", "k-order", 1, "the order id refuses a second charge whatever the key's retention")
}

// twoTenants: one key under two tenants is two operations, each charged
// once and each answered with its own response.
func twoTenants(t *testing.T, e *env) {
	verdict := oneAtATime(t, e.b.v, variant.CaseTenants, lab.Faults{}) // one attempt per tenant
	attempts := []lab.Attempt{
		e.attempt("acme", "k-shared", 2500, "order-1", lab.Faults{}),
		e.attempt("acme"+lab.SecondTenantSuffix, "k-shared", 4200, "order-1", lab.Faults{}), // the namespace's second tenant
	}
	firsts := make([]lab.Outcome, len(attempts))
	errs := make([]error, len(attempts))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, a := range attempts {
		wg.Go(func() {
			<-start
			firsts[i], errs[i] = e.charge(t, a)
		})
	}
	close(start)
	wg.Wait()
	for i, a := range attempts {
		if verdict == lab.Breaks {
			continue
		}
		fresh(t, a.Scope.Tenant, firsts[i], errs[i])
		if c := chargeBody(t, firsts[i].Response); c.AmountCents != a.Request.AmountCents {
			t.Fatalf("%s got a charge of %d, want its own %d", a.Scope.Tenant, c.AmountCents, a.Request.AmountCents)
		}
		out, err := e.charge(t, a)
		replayOf(t, a.Scope.Tenant+"'s retry", firsts[i].Response, out, err)
		if k := wantCharges(t, e, a.Scope.Tenant, "k-shared", 1, "each tenant charged once"); k.Cents != a.Request.AmountCents {
			t.Fatalf("%s's ledger holds %d cents, want %d", a.Scope.Tenant, k.Cents, a.Request.AmountCents)
		}
	}
}
