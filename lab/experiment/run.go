package experiment

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/history"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/reconcile"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Scenario is the shape of a run's attempts.
type Scenario string

// Scenarios besides a plain retry storm.
const (
	ScenarioRetries Scenario = "retries" // N identical attempts
	ScenarioReused  Scenario = "reused"  // the same key with another amount
	ScenarioTenants Scenario = "tenants" // two tenants, one key
)

// Spec describes one lab run.
type Spec struct {
	Store       lab.StoreName
	Scenario    Scenario
	Key         string
	Account     string
	AmountCents int64
	OrderID     string
	Attempts    int
	// Namespace is the run's, as the API resolved it from the caller: the
	// tenants, charges and reads of the run are all of it.
	Namespace   lab.Namespace
	Tenant      string // the run's tenant, and the bearer token its attempts carry
	Token       string
	OtherTenant string // the namespace's second tenant (the API's, of the same identity), for ScenarioTenants
	OtherToken  string
	Faults      lab.Faults
	Matrix      string // the matrix batch this run is a cell of, if any
	// Ignored says which of the run's parameters its store has nothing to
	// apply to; the note repeats it.
	Ignored []string
	// Confine, when set, is a prefix of Key: the run's crash or restart
	// forgets only the namespace's keys under it (the matrix's cells do).
	Confine string
}

// GroundTruth is what a run is judged by: the ledger and the outbox.
type GroundTruth interface {
	// OpenRun registers a run in its namespace before its attempts carry it
	// (Lab-Run), so a charge of another namespace can never join it.
	OpenRun(ctx context.Context, ns lab.Namespace, run string) error
	// RunStats counts what the run created in its namespace.
	RunStats(ctx context.Context, ns lab.Namespace, run string) (lab.RunStats, error)
	// KeyCharges tallies the charges one store made under one tenant's key.
	KeyCharges(ctx context.Context, tenant string, store lab.StoreName, key string) (lab.KeyTally, error)
	Balance(ctx context.Context, tenant, account string) (int64, error)
	// AccountMoney reads an account's balance and the sum of its ledger
	// rows in one snapshot.
	AccountMoney(ctx context.Context, tenant, account string) (lab.AccountMoney, error)
	OutboxStats(ctx context.Context, ns lab.Namespace) (lab.OutboxStats, error)
	// Payments lists a namespace's charges with their payment state.
	Payments(ctx context.Context, ns lab.Namespace, run string, limit int) ([]lab.Payment, error)
	Events(ctx context.Context, ns lab.Namespace, limit int) ([]lab.Event, error)
}

// Runner sends runs to real servers and reads their outcome from the books.
// Every field is required. A run acts with its tenant's token only: what it
// does (a store restart included) stays in that tenant's namespace.
type Runner struct {
	Client   *http.Client
	Books    GroundTruth
	Provider ProviderRecords
	Variants *variant.Registry
	Now      lab.Clock
	// PGFailover is the lab's PostgreSQL pair, nil where there is none.
	PGFailover PGFailover
}

// ProviderRecords is what a run reads of the payment provider: its own records of
// what the run's effects did there.
type ProviderRecords interface {
	Stats(ctx context.Context, f provider.Filter) (provider.StatsReport, error)
	Captures(ctx context.Context, f provider.Filter) ([]provider.Capture, error)
	SetFaults(ctx context.Context, ns string, f provider.Faults) error
	ClearFaults(ctx context.Context, ns string) error
}

// Report is one run's row: the ledger's figures, the verdict and why.
type Report struct {
	RunID               string         `json:"run_id"`
	Store               lab.StoreName  `json:"store"`
	Variant             string         `json:"variant"` // "idempotent" or "unsafe", as the multi-language lab says
	Scenario            Scenario       `json:"scenario"`
	Fault               lab.FaultPoint `json:"fault,omitempty"`
	Key                 string         `json:"key"`
	Account             string         `json:"account"`
	Namespace           lab.Namespace  `json:"namespace"`
	Tenant              string         `json:"tenant"`
	Attempts            int            `json:"attempts"`
	Replicas            int            `json:"replicas"`
	AmountCents         int64          `json:"amount_cents"`
	ExpectedCharges     int            `json:"expected_charges"` // what this run should add to the ledger
	ChargesApplied      int            `json:"charges_applied"`
	KeyCharges          int            `json:"key_charges"`
	DuplicatesPrevented int            `json:"duplicates_prevented"`
	DuplicatesApplied   int            `json:"duplicates_applied"`
	IdempotencyHits     int            `json:"idempotency_hits"`
	Rejections          int            `json:"rejections"`
	InProgress          int            `json:"in_progress"`
	Dropped             int            `json:"dropped_connections"`
	BalanceCents        int64          `json:"balance_cents"`         // the account's balance after the run (the peer lab's field)
	AccountBalanceCents int64          `json:"account_balance_cents"` // the same, named for what it is: every charge to the account so far
	RunChargedCents     int64          `json:"run_charged_cents"`     // what this run charged, from the ledger rows it added
	OverchargedCents    int64          `json:"overcharged_cents"`
	SideEffectsEmitted  int            `json:"side_effects_emitted"`
	// What the provider recorded of the run, from its own records.
	ProviderCaptures     int `json:"provider_captures"`      // captures applied
	ProviderCaptureCalls int `json:"provider_capture_calls"` // capture requests that reached it
	ProviderReceipts     int `json:"provider_receipts"`      // distinct receipts
	ChargesCapturedTwice int `json:"charges_captured_twice"` // charges the provider captured more than once
	// LedgerRows are the ledger rows the run added (the first 64), oldest
	// first, with their payment state.
	LedgerRows []lab.Payment `json:"ledger_rows,omitempty"`
	// FencedWrites are ledger writes the fence refused in this run: stale
	// workers whose claim was taken over.
	FencedWrites int `json:"fenced_writes"`
	// CapturesWithoutCharge are captures of charges the ledger does not
	// hold: sent, then rolled back.
	CapturesWithoutCharge int `json:"captures_without_charge"`
	// ChargesNeverCaptured are charges whose effects were given up (or,
	// sent directly, lost) and never reached the provider.
	ChargesNeverCaptured int    `json:"charges_never_captured"`
	SideEffectTransport  string `json:"side_effect_transport"`
	ReceiptsMissing      int    `json:"receipts_missing"`
	// OutboxPending and OutboxDelivered are the namespace's running totals,
	// as the peer lab's fields are; the Run* figures are this run's own.
	OutboxPending      int `json:"outbox_pending"`
	OutboxDelivered    int `json:"outbox_delivered"`
	RunOutboxEvents    int `json:"run_outbox_events"`    // events this run's charges recorded
	RunOutboxDelivered int `json:"run_outbox_delivered"` // of those, delivered when the run was read
	RunOutboxPending   int `json:"run_outbox_pending"`   // of those, still pending then
	// Events: every time here and in the timeline is on one axis, from the
	// run's first release, whatever the number of its phases.
	Events []Event `json:"events"`
	// ClientBudgetMS bounds how long each attempt's client follows 409s,
	// 202s, dropped connections and 5xx until a final answer.
	ClientBudgetMS   float64 `json:"client_budget_ms"`
	KeyBefore        string  `json:"key_before"` // what the store held for the key when the run began
	KeyAfterFault    string  `json:"key_after_fault,omitempty"`
	LookupOverheadMS float64 `json:"lookup_overhead_ms"`
	// LookupOverheadByPath is the median replay latency per place a replay
	// was read from, for designs that say (a cache, then the database).
	LookupOverheadByPath map[string]float64 `json:"lookup_overhead_ms_by_path,omitempty"`
	DedupeWindowMS       int64              `json:"dedupe_window_ms,omitempty"`
	BarrierSpreadMS      float64            `json:"barrier_spread_ms"`
	WallMS               float64            `json:"wall_ms"`
	Verdict              lab.Verdict        `json:"verdict"`
	// Checked is the proof of the run's history (its tries and the ledger's
	// reads of the key): linearizable, violation (CheckedWhy names the
	// operations no single charge explains) or unknown (the check's time
	// ran out).
	Checked    history.Verdict `json:"checked"`
	CheckedWhy string          `json:"checked_why,omitempty"`
	CheckedOps int             `json:"checked_ops"`
	CheckMS    float64         `json:"check_ms"`
	// Money is the bank invariant over the accounts the run touched.
	Money MoneyCheck `json:"money"`
	// History is what was checked, served as NDJSON and drawn as a page.
	History         history.History `json:"-"`
	ExpectedVerdict lab.Verdict     `json:"expected_verdict"`
	Reason          string          `json:"reason"`
	Explanation     string          `json:"explanation"`
	Note            string          `json:"note"`
	Timeline        []Result        `json:"timeline"`
	StartedAt       time.Time       `json:"started_at"`
	// Matrix names the matrix batch the run was a cell of, "" for a run
	// of its own.
	Matrix string `json:"matrix,omitempty"`
	// Failover is what a PostgreSQL failover left on each server, and
	// LostAcknowledged the charges a client was told of that the surviving
	// books lack.
	Failover         *FailoverEvidence `json:"pg_failover,omitempty"`
	LostAcknowledged []string          `json:"lost_acknowledged,omitempty"`
}

// Run executes spec against targets (one base URL per replica; attempts go
// round-robin over them) and reads the result from the books.
func (r *Runner) Run(ctx context.Context, spec Spec, targets []string) (Report, error) {
	if spec.Scenario == "" {
		spec.Scenario = ScenarioRetries
	}
	tenant, ns := spec.Tenant, spec.Namespace
	if tenant == "" || spec.Token == "" || ns == "" {
		return Report{}, lab.Invalid("tenant", "a run needs a namespace, a tenant and its token")
	}
	if needsTwoPhases(spec) && spec.Attempts < 2 {
		return Report{}, lab.Invalid("attempts", "must be at least 2 with fault %s (one faulted attempt, then retries)", spec.Faults.Point)
	}
	if spec.Scenario != ScenarioRetries && spec.Attempts < 2 {
		return Report{}, lab.Invalid("attempts", "must be at least 2 in scenario %s", spec.Scenario)
	}
	v, ok := r.Variants.Get(spec.Store)
	if !ok {
		return Report{}, lab.Invalid("store", "unknown store %q", spec.Store)
	}
	if spec.Confine != "" && !strings.HasPrefix(spec.Key, spec.Confine) {
		return Report{}, lab.Invalid("key", "must start with %q, the prefix the run's faults are confined to", spec.Confine)
	}
	rep := Report{
		RunID: "run_" + uuid.NewString(), Store: spec.Store, Scenario: spec.Scenario, Fault: spec.Faults.Point,
		Key: spec.Key, Account: spec.Account, Namespace: ns, Tenant: tenant, Attempts: spec.Attempts, Replicas: len(targets),
		AmountCents: spec.AmountCents, ExpectedCharges: 1, StartedAt: r.Now().UTC(),
		SideEffectTransport: v.Effects, DedupeWindowMS: spec.Faults.Retention.Milliseconds(), Variant: "idempotent",
		Matrix: spec.Matrix,
	}
	if !v.RequiresKey {
		rep.Variant = "unsafe"
	}
	tenants := []string{tenant}
	if spec.Scenario == ScenarioTenants {
		other := spec.OtherTenant
		if other == "" || other == tenant || spec.OtherToken == "" {
			return Report{}, lab.Invalid("tenant", "the tenants scenario needs the namespace's second tenant")
		}
		tenants = append(tenants, other)
		rep.ExpectedCharges = 2
	}
	if err := r.Books.OpenRun(ctx, ns, rep.RunID); err != nil {
		return rep, fmt.Errorf("error opening the run: %w", err)
	}
	if spec.Faults.Replication != "" { // its charges are on the pair
		books, err := r.books(ctx, spec)
		if err != nil {
			return rep, err
		}
		if err := books.OpenRun(ctx, ns, rep.RunID); err != nil {
			return rep, fmt.Errorf("error opening the run on the PostgreSQL pair: %w", err)
		}
	}
	read, err := r.readLedger(ctx, spec, tenants)
	if err != nil {
		return rep, err
	}
	before := read.tally
	// A pg_failover run's key is on the pair, which the key's route does
	// not read: its evidence says what each server held instead.
	if spec.Faults.Replication == "" {
		if rep.KeyBefore, err = r.keyState(ctx, targets[0], spec); err != nil {
			return rep, err
		}
	}
	// What this run should add: one charge per tenant whose key is new; a
	// key already charged should get none.
	rep.ExpectedCharges = 0
	for _, k := range before {
		if k.Charges == 0 {
			rep.ExpectedCharges++
		}
	}

	ev := &events{origin: time.Now()}
	results, spread, err := r.fire(ctx, spec, targets, rep.RunID, &rep, ev)
	if err != nil {
		return rep, err
	}
	rep.WallMS = ms(time.Since(ev.origin))
	rep.BarrierSpreadMS = ms(spread)
	Rebase(results, ev.origin)
	rep.Timeline = results
	ev.fromPhases(results, lifetime{name: v.Lifetime, ttl: spec.Faults.ClaimTTL}, spec)
	rep.Events = append([]Event{}, ev.list...)
	rep.ClientBudgetMS = ms(clientBudget(spec))
	if err := r.conclude(ctx, spec, tenants, before, &rep); err != nil {
		return rep, err
	}
	r.judgeFailover(spec, &rep)
	return rep, r.prove(ctx, spec, tenants, read, ev.origin, &rep)
}

func needsTwoPhases(spec Spec) bool {
	return spec.Faults.Point != "" && spec.Faults.Point != lab.FaultSlow
}

// clientBudget bounds how long each attempt's client follows its answers
// (409 and 202 until a final answer, a dropped connection or a 5xx with a
// backoff): the work, three claim lifetimes and three seconds more.
func clientBudget(spec Spec) time.Duration {
	return spec.Faults.Work + 3*max(spec.Faults.ClaimTTL, time.Second) + 3*time.Second
}

// retrying is how every attempt of a run is followed, as the README's
// client does: Retry-After as sent, otherwise a backoff from 50 ms.
func retrying(spec Spec) Retry {
	return Retry{Budget: clientBudget(spec), Base: 50 * time.Millisecond}
}

// fire sends the run's attempts: all at once for a plain storm, or one
// faulted attempt followed by the others, retrying as clients do. Every
// time is on the run's axis, from its first release (ev.origin).
func (r *Runner) fire(ctx context.Context, spec Spec, targets []string, run string, rep *Report, ev *events) ([]Result, time.Duration, error) {
	reqs := make([]Request, spec.Attempts)
	for i := range reqs {
		reqs[i] = r.request(spec, targets[i%len(targets)], run, i)
	}
	if spec.Scenario == ScenarioRetries && !needsTwoPhases(spec) {
		res, spread := Fire(ctx, r.Client, reqs, retrying(spec))
		return res, spread, nil
	}
	if spec.Faults.Point == lab.FaultStaleWorker {
		return r.fireStale(ctx, spec, targets[0], reqs, ev)
	}
	if spec.Faults.Point == lab.FaultFailover {
		return r.fireFailover(ctx, spec, targets, reqs, rep, ev)
	}
	if spec.Faults.Point == lab.FaultPGFailover {
		return r.firePGFailover(ctx, spec, run, reqs, rep, ev)
	}
	// Phase one: the first attempt alone (carrying the fault, if any). Its
	// failure is the point, so it is sent once.
	first, _ := Fire(ctx, r.Client, reqs[:1], Retry{})
	switch spec.Faults.Point {
	case lab.FaultStoreRestart:
		for _, t := range targets {
			if err := r.restartStore(ctx, t, spec); err != nil {
				return nil, 0, err
			}
		}
		what := "the namespace's keys are forgotten"
		if spec.Confine != "" {
			what = "the keys under " + spec.Confine + " are forgotten"
		}
		ev.add(EventStoreRestart, 0, what)
	case lab.FaultExpired:
		if err := lab.Sleep(ctx, spec.Faults.Retention+50*time.Millisecond); err != nil {
			return nil, 0, err
		}
		ev.add(EventWindowExpired, 0, fmt.Sprintf("the %d ms retention window is over", spec.Faults.Retention.Milliseconds()))
	}
	if spec.Faults.Point != "" {
		state, err := r.keyState(ctx, targets[0], spec)
		if err != nil {
			return nil, 0, err
		}
		rep.KeyAfterFault = state
	}
	// Phase two: the retries, released together, following their answers
	// like a client until a final one (bounded).
	rest, spread := r.fireRetries(ctx, spec, reqs[1:], ev)
	return append(first, rest...), spread, nil
}

// fireRetries releases the attempts after the first, numbered after it.
func (r *Runner) fireRetries(ctx context.Context, spec Spec, reqs []Request, ev *events) ([]Result, time.Duration) {
	ev.add(EventRetriesReleased, 0, fmt.Sprintf("%d retries", len(reqs)))
	rest, spread := Fire(ctx, r.Client, reqs, retrying(spec))
	for i := range rest {
		rest[i].Attempt++
	}
	return rest, spread
}

// fireStale sends the first attempt, which pauses past its claim's
// lifetime; once that lifetime is over (and while it still sleeps) the
// retries go, released together; the first then wakes and writes. Its
// client follows its answer as any client does: a fenced worker that woke
// while the retry still worked is told 409, and asks again.
func (r *Runner) fireStale(ctx context.Context, spec Spec, target string, reqs []Request, ev *events) ([]Result, time.Duration, error) {
	firstDone, answered := make(chan []Result, 1), make(chan struct{})
	go func() {
		res, _ := Fire(ctx, r.Client, reqs[:1], retrying(spec))
		firstDone <- res
		close(answered)
	}()
	if err := r.awaitClaimOver(ctx, spec, target, answered); err != nil {
		<-firstDone
		return nil, 0, err
	}
	rest, spread := r.fireRetries(ctx, spec, reqs[1:], ev)
	return append(<-firstDone, rest...), spread, nil
}

// awaitClaimOver waits until the first attempt's claim has run out: its
// lifetime counted from when the key is first seen held, which is no
// earlier than the claim, however late a busy server took the attempt up.
// A design whose claims never run out (no Lifetime) gives the first
// attempt a moment to claim before its twins come; a first attempt that
// answered without a claim to wait for ends the wait.
func (r *Runner) awaitClaimOver(ctx context.Context, spec Spec, target string, answered <-chan struct{}) error {
	if v, _ := r.Variants.Get(spec.Store); v.Lifetime == "" {
		return lab.Sleep(ctx, spec.Faults.ClaimTTL+100*time.Millisecond)
	}
	for {
		state, err := r.keyState(ctx, target, spec)
		if err != nil {
			return err
		}
		if state == lab.KeyInFlight {
			return lab.Sleep(ctx, spec.Faults.ClaimTTL)
		}
		select {
		case <-answered:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// fireFailover holds the Redis pair's replication back, sends the first
// attempt (acknowledged by the primary alone), promotes the replica, and
// sends the retries, which reach the new primary.
func (r *Runner) fireFailover(ctx context.Context, spec Spec, targets []string, reqs []Request, rep *Report, ev *events) ([]Result, time.Duration, error) {
	err := r.failoverStep(ctx, targets[0], spec.Token, "hold")
	// Another namespace's failover is under way: wait for it to end (the lab
	// ends a hold past its deadline, and gives the turn to who waited).
	for wait := time.Now().Add(failoverQueue); errors.Is(err, lab.ErrFailoverUnderWay) && time.Now().Before(wait); {
		if serr := lab.Sleep(ctx, 100*time.Millisecond); serr != nil {
			return nil, 0, serr
		}
		err = r.failoverStep(ctx, targets[0], spec.Token, "hold")
	}
	if err != nil {
		if !errors.Is(err, lab.ErrFailoverUnderWay) {
			// The hold may have happened with its answer lost: end it.
			_ = r.failoverStep(context.WithoutCancel(ctx), targets[0], spec.Token, "promote")
		}
		return nil, 0, err
	}
	ev.add(EventFailoverHold, 0, "replication to the replica is held back: the primary alone acknowledges writes")
	first, _ := Fire(ctx, r.Client, reqs[:1], Retry{})
	// Promote whatever the first attempt did: the pair must not stay held.
	if err := r.failoverStep(context.WithoutCancel(ctx), targets[0], spec.Token, "promote"); err != nil {
		return nil, 0, err
	}
	ev.add(EventFailoverPromote, 0, "the replica is the primary now; what only the old primary held is gone")
	state, err := r.keyState(ctx, targets[0], spec)
	if err != nil {
		return nil, 0, err
	}
	rep.KeyAfterFault = state
	rest, spread := r.fireRetries(ctx, spec, reqs[1:], ev)
	return append(first, rest...), spread, nil
}

// failoverQueue bounds how long a failover run waits for another's to end:
// longer than the lab lets a hold last.
const failoverQueue = 7 * time.Second

// failoverStep asks the lab to move its Redis pair through a failover.
func (r *Runner) failoverStep(ctx context.Context, target, token, step string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/lab/failover?step="+step, nil)
	if err != nil {
		return fmt.Errorf("error building the failover step %s: %w", step, err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := r.Client.Do(req)
	if err != nil {
		return fmt.Errorf("error in the failover step %s: %w", step, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode == http.StatusConflict:
		return lab.ErrFailoverUnderWay
	case resp.StatusCode == http.StatusServiceUnavailable:
		return fmt.Errorf("%w: %s", lab.ErrStoreUnavailable, problemDetail(body))
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("failover step %s: status %d: %s", step, resp.StatusCode, body)
	}
	return nil
}

func (r *Runner) request(spec Spec, target, run string, i int) Request {
	token, amount, faults := spec.Token, attemptAmount(spec, i), spec.Faults
	if attemptTenant(spec, i) != spec.Tenant {
		token = spec.OtherToken
	}
	if i > 0 && faults.Point != lab.FaultSlow {
		faults.Point = "" // only the first attempt suffers the fault; retries are plain
	}
	if faults.Point == lab.FaultExpired {
		faults.Point = "" // the server needs only the short window
	}
	if faults.Point != "" {
		faults.Confine = spec.Confine // what its crash may forget
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token)
	h.Set("Idempotency-Key", spec.Key)
	h.Set("Lab-Run", run)
	if f := faults.String(); f != "" {
		h.Set(lab.FaultHeader, f)
	}
	body, _ := json.Marshal(lab.ChargeRequest{Account: spec.Account, AmountCents: amount, Currency: lab.DefaultCurrency, OrderID: spec.OrderID})
	return Request{URL: target + "/charges?store=" + url.QueryEscape(string(spec.Store)), Header: h, Body: body}
}

func (r *Runner) restartStore(ctx context.Context, target string, spec Spec) error {
	u := target + "/lab/restart-store?store=" + url.QueryEscape(string(spec.Store))
	if spec.Confine != "" {
		u += "&key_prefix=" + url.QueryEscape(spec.Confine)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return fmt.Errorf("error building the restart request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+spec.Token) // the run's namespace restarts, no other
	resp, err := r.Client.Do(req)
	if err != nil {
		return fmt.Errorf("error restarting store %s at %s: %w", spec.Store, target, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("error restarting store %s at %s: status %d", spec.Store, target, resp.StatusCode)
	}
	return nil
}

func (r *Runner) keyState(ctx context.Context, target string, spec Spec) (string, error) {
	u := target + "/idempotency/state?store=" + url.QueryEscape(string(spec.Store)) + "&key=" + url.QueryEscape(spec.Key)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", fmt.Errorf("error building the key state request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+spec.Token)
	resp, err := r.Client.Do(req)
	if err != nil {
		return "", fmt.Errorf("error reading key state at %s: %w", target, err)
	}
	defer resp.Body.Close()
	var body struct {
		KeyState string `json:"key_state"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return "", fmt.Errorf("error decoding key state: %w", err)
	}
	return body.KeyState, nil
}

// keyTally is the ledger's view of the run's key, per tenant.
type keyTally []lab.KeyTally

func (r *Runner) tally(ctx context.Context, spec Spec, tenants []string) (keyTally, error) {
	books, err := r.books(ctx, spec)
	if err != nil {
		return nil, err
	}
	out := make(keyTally, len(tenants))
	for i, t := range tenants {
		err := reread(ctx, func() (err error) {
			out[i], err = books.KeyCharges(ctx, t, spec.Store, spec.Key)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("error reading the ledger: %w", err)
		}
	}
	return out, nil
}

// deliveryWait bounds how long a run waits for the relay to deliver the
// events it wrote, so outbox_delivered counts them as the peer lab's does.
const deliveryWait = time.Second

// awaitDelivery reads the run's figures once its outbox events are
// delivered, or when deliveryWait is over.
func (r *Runner) awaitDelivery(ctx context.Context, books GroundTruth, ns lab.Namespace, run string) (lab.RunStats, error) {
	deadline := time.Now().Add(deliveryWait)
	for {
		var stats lab.RunStats
		if err := reread(ctx, func() (err error) { stats, err = books.RunStats(ctx, ns, run); return err }); err != nil {
			return stats, err
		}
		if stats.Delivered+stats.Dead >= stats.OutboxEvents || time.Now().After(deadline) {
			return stats, nil
		}
		if err := lab.Sleep(ctx, 20*time.Millisecond); err != nil {
			return stats, err
		}
	}
}

// reread runs a ledger read, and again after a short pause when it fails:
// a read that lost its connection (a store_restart kills sessions) is as
// safe to repeat as a charge with its key.
func reread(ctx context.Context, read func() error) error {
	err := read()
	for try := 1; err != nil && try < 4; try++ {
		if serr := lab.Sleep(ctx, time.Duration(try)*50*time.Millisecond); serr != nil {
			return errors.Join(err, serr)
		}
		err = read()
	}
	return err
}

func (k keyTally) charges() (n int) {
	for _, t := range k {
		n += t.Charges
	}
	return n
}

func (k keyTally) overcharged() (c int64) {
	for _, t := range k {
		c += t.OverchargedCents()
	}
	return c
}

// added counts, per run, the charges beyond what each tenant wanted from
// it: one for a key never charged before, none for a key already charged.
func added(before, after keyTally) (duplicates int) {
	for i := range after {
		wanted := 0
		if before[i].Charges == 0 {
			wanted = 1
		}
		duplicates += max(0, after[i].Charges-before[i].Charges-wanted)
	}
	return duplicates
}

// faultHitsFirstAttempt reports faults carried by the first attempt, whose
// failure is the point of the run.
func faultHitsFirstAttempt(spec Spec) bool {
	switch spec.Faults.Point {
	case lab.FaultCrashAfterClaim, lab.FaultCrashAfterCharge, lab.FaultOutboxFail, lab.FaultPGFailover,
		lab.FaultCrashAfterPhase, lab.FaultAppliedResponseLost:
		return true
	}
	return false
}

// conclude reads the ground truth and writes the verdict.
func (r *Runner) conclude(ctx context.Context, spec Spec, tenants []string, before keyTally, rep *Report) error {
	books, err := r.books(ctx, spec)
	if err != nil {
		return err
	}
	stats, err := r.awaitDelivery(ctx, books, spec.Namespace, rep.RunID)
	if err != nil {
		return fmt.Errorf("error reading run stats: %w", err)
	}
	after, err := r.tally(ctx, spec, tenants)
	if err != nil {
		return err
	}
	rep.ChargesApplied, rep.RunChargedCents = stats.Charges, stats.ChargedCents
	rep.FencedWrites = stats.FencedWrites
	rep.KeyCharges = after.charges()
	rep.DuplicatesApplied = added(before, after)
	rep.OverchargedCents = after.overcharged() - before.overcharged()
	var got provider.StatsReport
	runFilter := provider.Filter{Namespace: string(spec.Namespace), Run: rep.RunID}
	if err := reread(ctx, func() (err error) { got, err = r.Provider.Stats(ctx, runFilter); return err }); err != nil {
		return fmt.Errorf("error reading the provider's records: %w", err)
	}
	rep.ProviderCaptures, rep.ProviderCaptureCalls = got.CapturesApplied, got.CaptureRequests
	rep.ProviderReceipts, rep.ChargesCapturedTwice = got.Receipts, got.ChargesCapturedTwice
	rep.SideEffectsEmitted = stats.OutboxEvents + got.DirectCaptures
	if err := r.reconcile(ctx, books, spec.Namespace, rep); err != nil {
		return err
	}
	rep.ReceiptsMissing = max(0, stats.Charges-rep.SideEffectsEmitted)
	// The account's balance is the lab's books', as /idempotency/state reads
	// it: a pg_failover run charges the PostgreSQL pair's books instead,
	// which only its own figures read.
	if err := reread(ctx, func() (err error) { rep.BalanceCents, err = r.Books.Balance(ctx, tenants[0], spec.Account); return err }); err != nil {
		return fmt.Errorf("error reading the balance: %w", err)
	}
	rep.AccountBalanceCents = rep.BalanceCents
	var ob lab.OutboxStats
	if err := reread(ctx, func() (err error) { ob, err = books.OutboxStats(ctx, spec.Namespace); return err }); err != nil {
		return fmt.Errorf("error reading the outbox: %w", err)
	}
	rep.OutboxPending, rep.OutboxDelivered = ob.Pending, ob.Delivered
	rep.RunOutboxEvents, rep.RunOutboxDelivered = stats.OutboxEvents, stats.Delivered
	rep.RunOutboxPending = max(0, stats.OutboxEvents-stats.Delivered-stats.Dead)

	var replayLatencies []float64
	byPath := map[string][]float64{}
	var unanswered []string
	for i, res := range rep.Timeline {
		f := res.Final()
		switch {
		case f.Replayed:
			rep.IdempotencyHits++
			replayLatencies = append(replayLatencies, f.LatencyMS)
			if f.From != "" {
				byPath[f.From] = append(byPath[f.From], f.LatencyMS)
			}
		case f.Status == http.StatusUnprocessableEntity:
			rep.Rejections++
		case f.Status == http.StatusConflict && f.Code == "idempotency_in_progress":
			rep.InProgress++
		}
		final := !retryable(f) && (f.Status == http.StatusCreated || f.Status == http.StatusConflict || f.Status == http.StatusUnprocessableEntity)
		if final && (f.Status != http.StatusCreated || f.Replayed) {
			rep.DuplicatesPrevented++ // answered without a charge
		}
		// The faulted attempt is expected to fail.
		if !final && !(i == 0 && faultHitsFirstAttempt(spec)) {
			unanswered = append(unanswered, unansweredWhy(res, rep.ClientBudgetMS))
		}
		for _, t := range res.Tries {
			if t.Status == 0 {
				rep.Dropped++
			}
		}
	}
	rep.LookupOverheadMS = median(replayLatencies)
	for path, ls := range byPath {
		if rep.LookupOverheadByPath == nil {
			rep.LookupOverheadByPath = map[string]float64{}
		}
		rep.LookupOverheadByPath[path] = median(ls)
	}

	rep.ExpectedVerdict = r.expected(spec, rep.Replicas)
	v, _ := r.Variants.Get(spec.Store)
	ev := evidence{keyless: !v.RequiresKey, prior: before.charges(), added: stats.Charges, keyBefore: rep.KeyBefore, replays: rep.IdempotencyHits,
		inProgress: rep.InProgress, rejected: rep.Rejections, freshBy: freshByReplica(rep.Timeline)}
	switch {
	case len(unanswered) > 0:
		// Without answers the ledger's count says nothing about the store.
		rep.Verdict = lab.Inconclusive
		rep.Reason = fmt.Sprintf("%d attempt(s) got no final answer (%s); the ledger holds %d charge(s) for this key",
			len(unanswered), strings.Join(unanswered, "; "), rep.KeyCharges)
		rep.Explanation = fmt.Sprintf("%s. Without every attempt's final answer, the ledger's %d charge(s) for this key cannot be read as the store's doing",
			strings.Join(unanswered, ". "), rep.KeyCharges)
	case ev.prior > 0:
		// A key with history: the run is judged by what it added.
		rep.Verdict = lab.Holds
		if rep.DuplicatesApplied > 0 {
			rep.Verdict = lab.Breaks
		}
		rep.Reason = reason(spec, rep)
		rep.Explanation = ev.onChargedKey()
	case after.charges() == 0:
		rep.Verdict = lab.Inconclusive
		rep.Reason = "no charge was applied at all, so the run shows no duplicate to prevent"
		rep.Explanation = fmt.Sprintf("no attempt charged (%s), so there was no duplicate to prevent", ev.answers())
	case spec.Faults.Has(lab.FaultStaleWorker) && v.Lifetime != "" && rep.DuplicatesApplied == 0 && rep.FencedWrites == 0 && !takenOver(rep.Timeline):
		// The ledger's one charge is the paused worker's own: the race the
		// fault stages (a retry taking the key over) never happened.
		rep.Verdict = lab.Inconclusive
		rep.Reason = fmt.Sprintf("%s, so the %s was never tested; %s", NotOvertaken, v.Lifetime, reason(spec, rep))
		rep.Explanation = fmt.Sprintf("no retry took the key over from the paused worker (%s): when it woke, its %s had run out but nobody held its key, so it wrote as the only worker and the race this fault stages did not happen. The run says nothing about the store: run it again (on a busy machine the retries can come late) or with a longer work_ms",
			ev.answers(), v.Lifetime)
	default:
		rep.Verdict = lab.Holds
		if rep.DuplicatesApplied > 0 {
			rep.Verdict = lab.Breaks
		}
		rep.Reason = reason(spec, rep)
		rep.Explanation = r.explain(spec, rep.Replicas, rep.Verdict)
	}
	rep.Note = note(rep)
	for _, ig := range spec.Ignored {
		rep.Note += "; " + ig
	}
	return nil
}

// NotOvertaken starts the reason of a stale worker run whose retries all
// came after the paused worker woke and wrote.
const NotOvertaken = "no retry took the key over while its worker was paused"

// takenOver reports whether a retry claimed the key, or resumed it, in the
// run: with a stale worker, whether the worker was overtaken at all.
func takenOver(timeline []Result) bool {
	took := func(p lab.PhaseAt) bool { return p.Name == lab.PhaseClaim || p.Name == lab.PhaseResume }
	for _, res := range timeline {
		for _, t := range res.Tries {
			if res.Attempt > 1 && slices.ContainsFunc(t.Phases, took) { // attempt 1 is the worker
				return true
			}
		}
	}
	return false
}

// unansweredWhy says, in a sentence, why an attempt ended without a final
// answer: what it was told last, and whether the client's budget ran out.
func unansweredWhy(res Result, budgetMS float64) string {
	f := res.Final()
	at := f.StartMS + f.LatencyMS
	var told string
	switch {
	case f.Status == 0:
		told = "lost its connection without a response (" + f.Error + ")"
	case f.Status == http.StatusAccepted:
		told = "was still told 202 Accepted: the operation it polls had not finished"
	case f.Status == http.StatusConflict && f.Code == "idempotency_in_progress":
		told = "was still told 409: the first request was still in progress"
	case f.Status >= 500:
		told = fmt.Sprintf("was told %d %s, a failure the server asks to retry", f.Status, f.Code)
	default:
		return fmt.Sprintf("attempt %d was answered %s at %.0f ms, an answer that settles nothing (not 201, 409 or 422)", res.Attempt, describe(f), at)
	}
	if retryable(f) && len(res.Tries) > 0 && budgetMS > 0 {
		return fmt.Sprintf("attempt %d %s at %.0f ms, after %d tries, and its client's %.0f ms budget ran out", res.Attempt, told, at, len(res.Tries), budgetMS)
	}
	return fmt.Sprintf("attempt %d %s at %.0f ms", res.Attempt, told, at)
}

func describe(t Try) string {
	switch {
	case t.Status == 0:
		return "no response (" + t.Error + ")"
	case t.Code != "":
		return fmt.Sprintf("%d %s", t.Status, t.Code)
	}
	return fmt.Sprint(t.Status)
}

func reason(spec Spec, rep *Report) string {
	who := "this key"
	if spec.Scenario == ScenarioTenants {
		who = "this key across both tenants"
	}
	if earlier := rep.KeyCharges - rep.ChargesApplied; earlier > 0 {
		return fmt.Sprintf("the ledger holds %d charge(s) for %s: %d from earlier runs and %d from this one, which should have added none",
			rep.KeyCharges, who, earlier, rep.ChargesApplied)
	}
	return fmt.Sprintf("the ledger holds %d charge(s) for %s, %d expected", rep.KeyCharges, who, rep.ExpectedCharges)
}

func note(rep *Report) string {
	var parts []string
	if rep.DuplicatesApplied > 0 {
		parts = append(parts, fmt.Sprintf("%d duplicate charge(s), %d cents overcharged", rep.DuplicatesApplied, rep.OverchargedCents))
	}
	if rep.ReceiptsMissing > 0 {
		parts = append(parts, fmt.Sprintf("%d charge(s) whose receipt never went out", rep.ReceiptsMissing))
	}
	if rep.Rejections > 0 {
		parts = append(parts, fmt.Sprintf("%d attempt(s) rejected with 422 (key reused with another payload)", rep.Rejections))
	}
	if rep.FencedWrites > 0 {
		parts = append(parts, fmt.Sprintf("%d stale write(s) refused by the ledger's fence", rep.FencedWrites))
	}
	if rep.CapturesWithoutCharge > 0 {
		lost := "the ledger rolled back"
		if rep.Failover != nil {
			lost = "the failover lost"
		}
		parts = append(parts, fmt.Sprintf("%d capture(s) at the provider for a charge %s", rep.CapturesWithoutCharge, lost))
	}
	if rep.KeyAfterFault != "" {
		parts = append(parts, "key after the fault: "+rep.KeyAfterFault)
	}
	if len(parts) == 0 {
		return "one charge, every retry answered from the store"
	}
	return strings.Join(parts, "; ")
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	sort.Float64s(xs)
	return xs[len(xs)/2]
}

func problemCode(body []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Code
}

// maxLedgerRows bounds the rows a report lists: as many as a run's attempts.
const maxLedgerRows = 64

// runLimit bounds the charges and captures one run's reconciliation reads:
// more than any run makes.
const runLimit = 1000

// reconcile compares the run's charges with the provider's captures.
func (r *Runner) reconcile(ctx context.Context, books GroundTruth, ns lab.Namespace, rep *Report) error {
	var (
		payments []lab.Payment
		captures []provider.Capture
	)
	err := reread(ctx, func() (err error) { payments, err = books.Payments(ctx, ns, rep.RunID, runLimit); return err })
	if err != nil {
		return fmt.Errorf("error reading the run's charges: %w", err)
	}
	rep.LedgerRows = slices.Clone(payments[:min(len(payments), maxLedgerRows)])
	slices.Reverse(rep.LedgerRows) // oldest first, as they were charged
	err = reread(ctx, func() (err error) {
		captures, err = r.Provider.Captures(ctx, provider.Filter{Namespace: string(ns), Run: rep.RunID, Limit: runLimit})
		return err
	})
	if err != nil {
		return fmt.Errorf("error reading the provider's captures: %w", err)
	}
	for _, f := range reconcile.Compare(payments, captures, false, false).Findings {
		switch f.Problem {
		case reconcile.NotInLedger:
			rep.CapturesWithoutCharge++
		case reconcile.NeverCaptured:
			rep.ChargesNeverCaptured++
		}
	}
	return nil
}

// problemDetail reads a problem's detail.
func problemDetail(body []byte) string {
	var p struct {
		Detail string `json:"detail"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Detail
}
