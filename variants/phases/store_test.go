package phases_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/delivery"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/variants/phases"
)

const (
	lock          = time.Second
	completeAfter = 2 * time.Second
)

// rig is a phases store on a schema of its own, on a frozen clock (locks
// end when the test moves it), capturing at a real provider over HTTP.
type rig struct {
	pool     *pgxpool.Pool
	clock    *labtest.Clock
	provider labtest.ProviderServer
	courier  *delivery.Courier
}

func setup(t *testing.T) *rig {
	t.Helper()
	url, schema := labtest.Postgres(t)
	pool, err := pgdb.Open(t.Context(), pgdb.PoolConfig{URL: url, Schema: schema, Size: 10, Migrate: true, AppName: "lab-test-" + schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r := &rig{pool: pool, clock: labtest.NewClock(time.Now()), provider: labtest.StartProvider(t)}
	// A withheld answer ends the call soon, as the lab's own provider
	// timeout does.
	client := provider.NewClient(r.provider.URL, labtest.ProviderKey, &http.Client{Timeout: 200 * time.Millisecond})
	r.courier = delivery.New(client, pgdb.NewBooks(pool, r.clock.Now))
	return r
}

// store opens a store on the rig: one per process it stands for.
func (r *rig) store(t *testing.T) *phases.Store {
	t.Helper()
	s, err := phases.New(phases.Config{Pool: pgdb.NewPool(r.pool), Provider: r.courier, Window: time.Hour, Lock: lock,
		CompleteAfter: completeAfter, Now: r.clock.Now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func attempt(key string, f lab.Faults) lab.Attempt {
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: 2500, Currency: "USD"}
	return lab.Attempt{Scope: lab.Scope{Namespace: "acme", Tenant: "acme", Endpoint: lab.Endpoint, Key: key}, Request: req,
		Fingerprint: req.Fingerprint(), Store: phases.Name, Run: "run-phases", Faults: f}
}

// effects are what a key left, read from the ledger, the outbox and the
// provider: its charges, their receipt events and their captures.
type effects struct{ charges, events, captures int }

func (r *rig) effects(t *testing.T, key string) effects {
	t.Helper()
	var ids []string
	if err := r.pool.QueryRow(t.Context(), `SELECT coalesce(array_agg(id), '{}') FROM charges WHERE tenant_id = 'acme' AND idempotency_key = $1`, key).
		Scan(&ids); err != nil {
		t.Fatal(err)
	}
	e := effects{charges: len(ids)}
	if err := r.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE charge_id = ANY ($1)`, ids).Scan(&e.events); err != nil {
		t.Fatal(err)
	}
	captures, err := r.provider.Records.Captures(t.Context(), provider.Filter{Namespace: "acme", Run: "run-phases", Limit: provider.MaxLimit})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range captures {
		if slices.Contains(ids, c.ChargeID) {
			e.captures++
		}
	}
	return e
}

// completedBy reads who finished a key.
func (r *rig) completedBy(t *testing.T, key string) string {
	t.Helper()
	var by *string
	if err := r.pool.QueryRow(t.Context(), `SELECT completed_by FROM phase_requests WHERE idempotency_key = $1`, key).Scan(&by); err != nil {
		t.Fatal(err)
	}
	if by == nil {
		return ""
	}
	return *by
}

// TestEveryCrashPointEndsWithOneChargeAndOneCapture: a first attempt stops
// at each point the design has — after phase one, two or three, with the
// provider's answer lost, with phase four's outbox write failing, after
// everything committed — and then either its retry or the completer comes
// first. Whichever it is, the ledger holds one charge, the outbox one
// receipt event, the provider one capture, and every later retry replays
// one answer.
func TestEveryCrashPointEndsWithOneChargeAndOneCapture(t *testing.T) {
	stops := []struct {
		name     string
		f        lab.Faults
		want     error
		released bool // the lock was let go: a retry resumes at once
		finished bool // nothing is left to complete
	}{
		{"crash_after_phase_1", lab.Faults{Point: lab.FaultCrashAfterPhase, Phase: 1}, lab.ErrCrash, false, false},
		{"crash_after_phase_2", lab.Faults{Point: lab.FaultCrashAfterPhase, Phase: 2}, lab.ErrCrash, false, false},
		{"crash_after_phase_3", lab.Faults{Point: lab.FaultCrashAfterPhase, Phase: 3}, lab.ErrCrash, false, false},
		{"applied_response_lost", lab.Faults{Point: lab.FaultAppliedResponseLost}, lab.ErrStoreUnavailable, true, false},
		{"outbox_fail", lab.Faults{Point: lab.FaultOutboxFail}, lab.ErrOutboxWrite, true, false},
		{"crash_after_charge", lab.Faults{Point: lab.FaultCrashAfterCharge}, lab.ErrCrash, false, true},
	}
	r := setup(t)
	s := r.store(t)
	ctx := t.Context()
	for _, stop := range stops {
		for _, order := range []string{"retry", "completer"} {
			t.Run(stop.name+"/"+order, func(t *testing.T) {
				key := "k-" + stop.name + "-" + order
				if _, err := s.Charge(ctx, attempt(key, stop.f)); !errors.Is(err, stop.want) {
					t.Fatalf("first attempt: %v; want %v", err, stop.want)
				}
				retry := attempt(key, lab.Faults{})
				if !stop.released && !stop.finished {
					if _, err := s.Charge(ctx, retry); !errors.Is(err, lab.ErrInProgress) {
						t.Fatalf("retry while the key is locked: %v; want 409 in progress", err)
					}
				}
				var first lab.Outcome
				switch order {
				case "retry":
					r.clock.Advance(lock)
					out, err := s.Charge(ctx, retry)
					if err != nil || out.Response.Status != http.StatusCreated || out.Replayed != stop.finished {
						t.Fatalf("retry: %+v %v; want 201, replayed only when everything had committed", out, err)
					}
					first = out
				case "completer":
					r.clock.Advance(lock + completeAfter)
					n, err := s.Complete(ctx)
					if want := map[bool]int{true: 0, false: 1}[stop.finished]; err != nil || n != want {
						t.Fatalf("completer finished %d key(s) (%v); want %d", n, err, want)
					}
					if !stop.finished && r.completedBy(t, key) != "completer" {
						t.Errorf("completed_by %q, want completer", r.completedBy(t, key))
					}
				}
				again, err := s.Charge(ctx, retry)
				if err != nil || !again.Replayed || again.Response.Status != http.StatusCreated {
					t.Fatalf("a later retry: %+v %v; want a replay of 201", again, err)
				}
				if first.Response.Body != nil && string(first.Response.Body) != string(again.Response.Body) {
					t.Fatalf("replay %s differs from the answer %s", again.Response.Body, first.Response.Body)
				}
				if e := r.effects(t, key); e.charges != 1 || e.events != 1 || e.captures != 1 {
					t.Fatalf("after %s then the %s: %d charge(s), %d receipt event(s), %d capture(s) at the provider; want one each",
						stop.name, order, e.charges, e.events, e.captures)
				}
			})
		}
	}
}

// TestCompleterAndLateRetryRace: a key stopped after its charge; once the
// completer may take it, two completers (two processes) and the client's
// late retry go for it at once. One of them finishes it, the retry gets
// the one answer (fresh if it finished, a replay otherwise), and the
// ledger and the provider hold one charge and one capture.
func TestCompleterAndLateRetryRace(t *testing.T) {
	r := setup(t)
	stores := []*phases.Store{r.store(t), r.store(t)}
	ctx := t.Context()
	for i := range 6 {
		key := fmt.Sprintf("k-race-%d", i)
		if _, err := stores[0].Charge(ctx, attempt(key, lab.Faults{Point: lab.FaultCrashAfterPhase, Phase: 2})); !errors.Is(err, lab.ErrCrash) {
			t.Fatalf("first attempt: %v; want the crash", err)
		}
		r.clock.Advance(lock + completeAfter)
		start := make(chan struct{})
		var wg sync.WaitGroup
		finished := make([]int, len(stores))
		for c, s := range stores {
			wg.Go(func() {
				<-start
				n, err := s.Complete(ctx)
				if err != nil {
					t.Errorf("completer %d: %v", c, err)
				}
				finished[c] = n
			})
		}
		var out lab.Outcome
		var err error
		wg.Go(func() {
			<-start
			out, err = retryUntilAnswered(ctx, stores[1], attempt(key, lab.Faults{}))
		})
		close(start)
		wg.Wait()
		if err != nil || out.Response.Status != http.StatusCreated {
			t.Fatalf("late retry: %+v %v; want 201", out, err)
		}
		byCompleter := finished[0] + finished[1]
		switch {
		case byCompleter > 1:
			t.Fatalf("two completers finished key %s", key)
		case byCompleter == 1 && (!out.Replayed || r.completedBy(t, key) != "completer"):
			t.Fatalf("a completer finished %s, yet the retry was answered replayed=%v and the key says %q", key, out.Replayed, r.completedBy(t, key))
		case byCompleter == 0 && (out.Replayed || r.completedBy(t, key) != "request"):
			t.Fatalf("no completer finished %s, yet the retry was answered replayed=%v and the key says %q", key, out.Replayed, r.completedBy(t, key))
		}
		if e := r.effects(t, key); e.charges != 1 || e.events != 1 || e.captures != 1 {
			t.Fatalf("%s: %d charge(s), %d receipt event(s), %d capture(s); want one each", key, e.charges, e.events, e.captures)
		}
	}
}

// retryUntilAnswered follows 409s as a client does, until an answer.
func retryUntilAnswered(ctx context.Context, s lab.Store, a lab.Attempt) (lab.Outcome, error) {
	for {
		out, err := s.Charge(ctx, a)
		if !errors.Is(err, lab.ErrInProgress) {
			return out, err
		}
		if err := lab.Sleep(ctx, 5*time.Millisecond); err != nil {
			return out, err
		}
	}
}

// TestAnotherRequestOnAChargedKeyIsRefused: once a key created its charge,
// it is bound to that request even while nothing holds it: another amount
// gets 422 and changes nothing; the request's own retry finishes it.
func TestAnotherRequestOnAChargedKeyIsRefused(t *testing.T) {
	r := setup(t)
	s := r.store(t)
	ctx := t.Context()
	const key = "k-bound"
	if _, err := s.Charge(ctx, attempt(key, lab.Faults{Point: lab.FaultCrashAfterPhase, Phase: 2})); !errors.Is(err, lab.ErrCrash) {
		t.Fatalf("first attempt: %v; want the crash", err)
	}
	r.clock.Advance(lock)
	other := attempt(key, lab.Faults{})
	other.Request.AmountCents = 9900
	other.Fingerprint = other.Request.Fingerprint()
	if _, err := s.Charge(ctx, other); !errors.Is(err, lab.ErrKeyReused) {
		t.Fatalf("another amount on the charged key: %v; want 422", err)
	}
	if out, err := s.Charge(ctx, attempt(key, lab.Faults{})); err != nil || out.Replayed || out.Response.Status != http.StatusCreated {
		t.Fatalf("the request's retry: %+v %v; want a fresh 201", out, err)
	}
	if e := r.effects(t, key); e.charges != 1 || e.captures != 1 {
		t.Fatalf("%d charge(s), %d capture(s); want one each", e.charges, e.captures)
	}
}
