package api

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labsvc"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/tenants"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Defaults of the lab routes, as attendees know them.
const (
	freshKey        = "fresh" // key=fresh: a new key for this run
	defaultKey      = "order-4711"
	defaultAccount  = labsvc.DefaultAccount
	defaultAttempts = 5
	defaultAmount   = labsvc.DefaultAmount
	defaultLimit    = 20
	defaultTTLms    = 1000 // redis claim TTL of lab runs; each fault's own defaults are in lab.FaultSpecs
)

// chargeUnsafe runs the design that ignores the key.
func (s *Server) chargeUnsafe(c echo.Context) error {
	for _, v := range s.deps.Variants.All() {
		if !v.RequiresKey {
			return s.labRun(c, v.Name)
		}
	}
	return fmt.Errorf("%w: no registered store ignores the key", lab.ErrStoreUnavailable)
}

// chargeIdempotent runs ?store=, a design that checks the key.
func (s *Server) chargeIdempotent(c echo.Context) error {
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	name, err := s.storeParam(q, "store")
	if err != nil {
		return err
	}
	if v, _ := s.deps.Variants.Get(name); !v.RequiresKey {
		return lab.Invalid("store", "must be an idempotent store; /charge-unsafe runs %s", name)
	}
	return s.labRun(c, name)
}

// labRun parses a run's parameters, fires it and answers its report.
func (s *Server) labRun(c echo.Context, store lab.StoreName) error {
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	spec, replicas, err := s.parseSpec(c, store, who.Identity)
	if err != nil {
		return err
	}
	rep, err := s.deps.Service.Run(c.Request().Context(), spec, replicas)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rep)
}

// runs is GET /lab/runs: the namespace's recent runs (matrix cells
// included), newest first, without their timelines.
func (s *Server) listRuns(c echo.Context) error {
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	limit, err := q.Int("limit", defaultLimit, 1, labsvc.MaxRunHistory)
	if err != nil {
		return err
	}
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	runs := s.deps.Service.Runs(who.view(), false)
	return c.JSON(http.StatusOK, runsAnswer{Namespace: string(who.view()), Replica: s.cfg.Replica, Runs: runs[:min(len(runs), int(limit))],
		Note: "this replica's recent runs of the namespace (at most " + strconv.Itoa(labsvc.MaxRunHistory) + "); GET /lab/runs/{run_id} opens one with its timeline"})
}

// openRun is POST /lab/runs: a run of the caller's namespace, for charges
// sent by hand to carry in their Lab-Run header and be counted together.
func (s *Server) openRun(c echo.Context) error {
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	if who.admin {
		return lab.Invalid("Authorization", "the admin charges nobody, so opens no run: use an attendee's token")
	}
	run := "run_" + uuid.NewString()
	if err := s.deps.Books.OpenRun(c.Request().Context(), who.Namespace, run); err != nil {
		return fmt.Errorf("%w: %w", lab.ErrStoreUnavailable, err)
	}
	return c.JSON(http.StatusCreated, openRunAnswer{RunID: run, Namespace: string(who.Namespace),
		Note: "send Lab-Run: " + run + " with your charges (and your token): only your namespace's charges count in it"})
}

// run is GET /lab/runs/{run_id}: one of the caller's runs, whole.
func (s *Server) run(c echo.Context) error {
	if _, err := wire.ParseQuery(c.Request().URL.RawQuery); err != nil {
		return err
	}
	r, err := s.findRun(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, r)
}

func (s *Server) parseSpec(c echo.Context, store lab.StoreName, id tenants.Identity) (experiment.Spec, int, error) {
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return experiment.Spec{}, 0, err
	}
	spec := experiment.Spec{Store: store, Namespace: id.Namespace, Tenant: id.Tenant, Token: id.Token}
	if spec.Key, err = q.Text("key", defaultKey, lab.MaxKeyBytes); err != nil {
		return spec, 0, err
	}
	if spec.Key == freshKey { // the lab picks a key never used, and the report names it
		spec.Key = "fresh-" + uuid.NewString()[:8]
	}
	if spec.Account, err = q.Text("account", defaultAccount, lab.MaxAccountBytes); err != nil {
		return spec, 0, err
	}
	if spec.OrderID, err = q.Text("order_id", "", lab.MaxOrderIDBytes); err != nil {
		return spec, 0, err
	}
	attempts, err := q.Int("attempts", defaultAttempts, 1, 64)
	if err != nil {
		return spec, 0, err
	}
	if spec.AmountCents, err = q.Int("amount", defaultAmount, 1, lab.MaxAmountCents); err != nil {
		return spec, 0, err
	}
	replicas, err := q.Int("replicas", 1, 1, int64(s.deps.Service.Replicas().MaxReplicas()))
	if err != nil {
		return spec, 0, err
	}
	spec.Attempts = int(attempts)
	for _, p := range []string{"tenant", "other_tenant"} {
		if _, present, _ := q.Lookup(p); present {
			return spec, 0, lab.Invalid(p, "is not a parameter: a run acts as the tenant of your token (none: the public namespace)")
		}
	}
	scenario, err := q.Choice("scenario", string(experiment.ScenarioRetries),
		string(experiment.ScenarioRetries), string(experiment.ScenarioReused), string(experiment.ScenarioTenants))
	if err != nil {
		return spec, 0, err
	}
	if spec.Scenario = experiment.Scenario(scenario); spec.Scenario == experiment.ScenarioTenants {
		second := id.Second() // the namespace's other tenant
		if second.Tenant == id.Tenant {
			return spec, 0, lab.Invalid("scenario", "tenants runs as a namespace's first tenant; this token is its second")
		}
		spec.OtherToken, spec.OtherTenant = second.Token, second.Tenant
	}
	fault, err := q.Name("fault", "none")
	if err != nil {
		return spec, 0, err
	}
	if err := s.faultParamsApply(q, &spec, fault); err != nil {
		return spec, 0, err
	}
	_, ttlGiven, _ := q.Lookup("ttl_ms")
	if fault == "none" && !ttlGiven {
		return spec, int(replicas), nil // a plain run: no Lab-Fault header at all
	}
	if err := s.requireFaults(); err != nil {
		return spec, 0, err // ttl_ms and faults travel in the Lab-Fault header
	}
	ttl, err := q.Int("ttl_ms", defaultTTLms, 1, 60_000)
	if err != nil {
		return spec, 0, err
	}
	spec.Faults.ClaimTTL = time.Duration(ttl) * time.Millisecond
	if fault == "none" {
		return spec, int(replicas), nil
	}
	if spec.Faults.Point, err = lab.ParseFaultPoint("fault", fault); err != nil {
		return spec, 0, err
	}
	switch spec.Faults.Point {
	case lab.FaultSlow:
		work, err := q.Int("work_ms", lab.FaultDefault(lab.FaultSlow, "work_ms"), 1, maxSlowWork.Milliseconds())
		if err != nil {
			return spec, 0, err
		}
		spec.Faults.Work = time.Duration(work) * time.Millisecond
	case lab.FaultStaleWorker:
		if !ttlGiven {
			spec.Faults.ClaimTTL = time.Duration(lab.FaultDefault(lab.FaultStaleWorker, "ttl_ms")) * time.Millisecond
		}
		work, err := q.Int("work_ms", lab.FaultDefault(lab.FaultStaleWorker, "work_ms"), 1, maxSlowWork.Milliseconds())
		if err != nil {
			return spec, 0, err
		}
		spec.Faults.Work = time.Duration(work) * time.Millisecond
		if spec.Faults.Work <= spec.Faults.ClaimTTL {
			return spec, 0, lab.Invalid("work_ms", "must exceed ttl_ms (%d): the worker has to outlive its lease", spec.Faults.ClaimTTL.Milliseconds())
		}
	case lab.FaultFailover:
		spec.Faults.OnPair = true // every attempt of the run goes to the pair
	case lab.FaultPGFailover:
		mode, err := replicationParam(q)
		if err != nil {
			return spec, 0, err
		}
		if v, _ := s.deps.Variants.Get(spec.Store); !slices.Contains(v.Needs, variant.NeedPostgres) {
			return spec, 0, lab.Invalid("fault", "pg_failover fails over the PostgreSQL that holds the keys, and %s keeps none there: run it on postgres, lease, phases or redis+postgres", spec.Store)
		}
		spec.Faults.Replication = mode // every attempt of the run charges on the pair
	case lab.FaultCrashAfterPhase:
		phase, err := q.Int("phase", lab.DefaultCrashPhase, 1, lab.MaxCrashPhase)
		if err != nil {
			return spec, 0, err
		}
		spec.Faults.Phase = int(phase)
	case lab.FaultExpired:
		window, err := q.Int("window_ms", lab.FaultDefault(lab.FaultExpired, "window_ms"), 1, 60_000)
		if err != nil {
			return spec, 0, err
		}
		spec.Faults.Retention = time.Duration(window) * time.Millisecond
	}
	return spec, int(replicas), nil
}

// replicationParam reads ?replication= of a pg_failover run: async (the
// default, PostgreSQL's) or sync.
func replicationParam(q wire.Query) (lab.Replication, error) {
	modes := lab.FaultChoices(lab.FaultPGFailover, "replication")
	mode, err := q.Choice("replication", modes[0], modes...)
	return lab.Replication(mode), err
}

// faultParams are the run parameters that belong to one fault or another.
var faultParams = []string{"work_ms", "ttl_ms", "window_ms", "replication", "phase"}

// faultParamsApply refuses a fault parameter that the chosen fault does not
// take (ttl_ms, the claim TTL, also goes without a fault), and notes those
// that the store has nothing to apply to: the page sends one query to two
// stores side by side, so a parameter of the fault is accepted on both.
func (s *Server) faultParamsApply(q wire.Query, spec *experiment.Spec, fault string) error {
	var takes []string
	for _, f := range lab.FaultSpecs() {
		if string(f.Point) == fault {
			takes = f.Params
		}
	}
	if fault == "none" {
		takes = []string{"ttl_ms"}
	}
	v, _ := s.deps.Variants.Get(spec.Store)
	for _, p := range faultParams {
		if _, present, _ := q.Lookup(p); !present {
			continue
		}
		if !slices.Contains(takes, p) {
			var by []string
			for _, f := range lab.FaultSpecs() {
				if slices.Contains(f.Params, p) {
					by = append(by, string(f.Point))
				}
			}
			return lab.Invalid(p, "belongs to fault %s, and this run's fault is %s", strings.Join(by, ", "), fault)
		}
		switch {
		case p == "ttl_ms" && v.Lifetime == "":
			spec.Ignored = append(spec.Ignored, "ttl_ms has no effect on "+string(spec.Store)+": nothing bounds its claims in time")
		case p == "window_ms" && !v.RequiresKey:
			spec.Ignored = append(spec.Ignored, "window_ms has no effect on "+string(spec.Store)+": it keeps no keys")
		}
	}
	return nil
}

// state lists stored keys (bounded, newest first), or one key's state.
func (s *Server) state(c echo.Context) error {
	ctx := c.Request().Context()
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	limit, err := q.Int("limit", defaultLimit, 1, 200)
	if err != nil {
		return err
	}
	store, err := q.Name("store", "")
	if err != nil {
		return err
	}
	key, err := q.Text("key", "", lab.MaxKeyBytes)
	if err != nil {
		return err
	}
	account, err := q.Text("account", defaultAccount, lab.MaxAccountBytes)
	if err != nil {
		return err
	}
	names := s.deps.Variants.Names()
	if store != "" {
		st, err := s.pickStore(store)
		if err != nil {
			return err
		}
		names = []lab.StoreName{st.Name()}
	}
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	if key != "" {
		tenant := who.Tenant
		if len(names) != 1 {
			return lab.Invalid("store", "is required with key=")
		}
		k := lab.KeyState{Tenant: tenant, Key: key, State: lab.KeyAbsent} // a store that keeps no keys never holds this one
		if l, ok := s.deps.Stores[names[0]].(lab.KeyLooker); ok {
			if k, err = l.Lookup(ctx, lab.Scope{Namespace: who.Namespace, Tenant: tenant, Endpoint: lab.Endpoint, Key: key}); err != nil {
				return err
			}
		}
		return c.JSON(http.StatusOK, keyStateAnswer{Store: names[0], Seen: k.State, KeyState: k})
	}
	stores := map[lab.StoreName]storeKeys{}
	for _, name := range names {
		st, ok := s.deps.Stores[name]
		if !ok {
			continue
		}
		keys, total := []lab.KeyState{}, 0
		if l, ok := st.(lab.KeyLister); ok {
			if keys, total, err = l.Keys(ctx, who.view(), int(limit)); err != nil {
				return err
			}
		}
		if keys == nil {
			keys = []lab.KeyState{}
		}
		v, _ := s.deps.Variants.Get(name)
		where := v.Keys
		if d, ok := st.(lab.Describer); ok {
			where = d.Describe()
		}
		stores[name] = storeKeys{Keys: keys, Total: total, Where: where}
	}
	balances := map[string]int64{}
	for _, tenant := range []string{who.Tenant, who.Second().Tenant} {
		b, err := s.deps.Books.Balance(ctx, tenant, account)
		if err != nil {
			return err
		}
		balances[tenant] = b
	}
	// The multi-language lab's fields: the keys of one idempotent store (the
	// default one unless store= names another), and the ledger per account.
	peerStore := cmp.Or(lab.StoreName(store), s.cfg.DefaultStore)
	peerKeys := map[string]peerKey{}
	keyCount := 0
	if l, ok := s.deps.Stores[peerStore].(lab.KeyLister); ok {
		keys, total, err := l.Keys(ctx, who.view(), int(limit))
		if err != nil {
			return err
		}
		keyCount = total
		for _, k := range keys {
			expired := !k.ExpiresAt.IsZero() && !s.cfg.Clock().Before(k.ExpiresAt)
			peerKeys[k.Key] = peerKey{AgeMS: k.AgeMS, Expired: expired, HasResponse: k.State == lab.KeyCompleted, Tenant: k.Tenant}
		}
	}
	return c.JSON(http.StatusOK, stateAnswer{
		Replica: s.cfg.Replica, Namespace: string(who.view()), Stores: stores, Limit: limit,
		DedupeWindowMS: s.cfg.Window.Milliseconds(), Account: account, BalanceCents: balances,
		Keys: peerKeys, KeyCount: keyCount, KeysStore: peerStore,
		LedgerCents: map[string]int64{account: balances[who.Tenant]},
		Note:        "keys are kept for the dedupe window and evicted after it: a key that lived forever would be a table that grows forever",
	})
}

func (s *Server) outbox(c echo.Context) error {
	ctx := c.Request().Context()
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	limit, err := q.Int("limit", defaultLimit, 1, 200)
	if err != nil {
		return err
	}
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	events, err := s.deps.Books.Events(ctx, who.view(), int(limit))
	if err != nil {
		return err
	}
	stats, err := s.deps.Books.OutboxStats(ctx, who.view())
	if err != nil {
		return err
	}
	// What was delivered is what the provider says it received.
	got, err := s.deps.Provider.Stats(ctx, provider.Filter{Namespace: string(who.view())})
	if err != nil {
		return fmt.Errorf("error reading the provider's records: %w", err)
	}
	unique, deliveries := got.Receipts, got.ReceiptDeliveries
	if events == nil {
		events = []lab.Event{}
	}
	// The multi-language lab's rows: the outbox, and what was delivered.
	rows, delivered := []peerRow{}, []peerRow{}
	for _, ev := range events {
		key, amount := ev.Receipt()
		at := ev.CreatedAt
		if ev.State == lab.EventDelivered {
			at = ev.DeliveredAt
		}
		row := peerRow{Key: key, Kind: ev.Type, AmountCents: amount, At: at.UTC(), Status: ev.State, Via: "outbox"}
		rows = append(rows, row)
		if ev.State == lab.EventDelivered {
			delivered = append(delivered, row)
		}
	}
	return c.JSON(http.StatusOK, outboxAnswer{
		Events: events, OutboxPending: stats.Pending, OutboxDelivered: stats.Delivered, OutboxDead: stats.Dead,
		OutboxInFlight: stats.InFlight, OutboxRetries: stats.Retries,
		OldestPendingMS: stats.OldestPendingAge.Milliseconds(), Receipts: unique, Deliveries: deliveries,
		DuplicateDeliveries: deliveries - unique, SideEffectTransport: "outbox (unsafe sends directly)",
		Provider: got.Stats,
		Outbox:   rows, Delivered: delivered, Limit: limit,
		OutboxTotal: stats.Pending + stats.Delivered + stats.Dead, DeliveredTotal: unique,
		Note: "the outbox is written in the charge's transaction; the relay delivers each event at least once: the capture keyed <charge id>:capture, the receipt deduplicated by event id at the provider",
	})
}

// retryEvent is POST /outbox/{id}/retry: a dead or failed event of the
// caller's namespace (any, for the admin) goes back to pending, due now.
func (s *Server) retryEvent(c echo.Context) error {
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	id := c.Param("id")
	ev, err := s.deps.Books.Requeue(c.Request().Context(), who.view(), id)
	switch {
	case errors.Is(err, lab.ErrEventNotFound):
		return problem(http.StatusNotFound, "event_not_found", "Event not found",
			"no outbox event "+strconv.Quote(id)+" in namespace "+nsName(who.view()))
	case errors.Is(err, lab.ErrEventDelivered):
		return problem(http.StatusConflict, "event_delivered", "Event already delivered",
			"outbox event "+strconv.Quote(id)+" was delivered; there is nothing to retry")
	case errors.Is(err, lab.ErrEventInFlight):
		return problem(http.StatusConflict, "event_in_flight", "Event being delivered",
			"a relay worker holds outbox event "+strconv.Quote(id)+"; it is retried when its lease ends")
	case err != nil:
		return err
	}
	s.log.InfoContext(c.Request().Context(), "outbox event re-queued", "event_id", ev.ID, "asked_by", nsName(who.view()))
	return c.JSON(http.StatusOK, requeueAnswer{Requeued: ev, Replica: s.cfg.Replica})
}

func (s *Server) summary(c echo.Context) error {
	ctx := c.Request().Context()
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	stores, err := s.deps.Books.Summary(ctx, who.view())
	if err != nil {
		return err
	}
	stats, err := s.deps.Books.OutboxStats(ctx, who.view())
	if err != nil {
		return err
	}
	// The peer lab's summary knows runs of one's own; matrix cells are
	// listed by GET /lab/runs.
	runs := slices.DeleteFunc(s.deps.Service.Runs(who.view(), false), func(r experiment.Report) bool { return r.Matrix != "" })
	if stores == nil {
		stores = []lab.StoreSummary{}
	}
	// The multi-language lab's counters, per kind of variant, summed from
	// the namespace's runs.
	variants := map[string]*peerCounters{"unsafe": {}, "idempotent": {}}
	for _, r := range runs {
		v := variants[r.Variant]
		if v == nil {
			continue
		}
		v.Runs++
		v.Attempts += r.Attempts
		v.ChargesApplied += r.ChargesApplied
		v.DuplicatesPrevented += r.DuplicatesPrevented
		v.DuplicatesApplied += r.DuplicatesApplied
		v.IdempotencyHits += r.IdempotencyHits
		v.SideEffectsEmitted += r.SideEffectsEmitted
		v.OverchargedCents += r.OverchargedCents
	}
	return c.JSON(http.StatusOK, summaryAnswer{
		Replica: s.cfg.Replica, Namespace: string(who.view()), Ledger: s.deps.Books.Kind(), Stores: stores,
		OutboxPending: stats.Pending, OutboxDelivered: stats.Delivered, OutboxDead: stats.Dead,
		RecentRuns: runs[:min(len(runs), 20)],
		Case:       peerCase, Stack: peerStack, Variants: variants,
		Interpretation: summaryInterpretation{
			Unsafe:     "charges_applied = attempts: every retry charged again; overcharged_cents is money the business must refund",
			Idempotent: "charges_applied = 1 and duplicates_prevented = attempts - 1 on a fresh key, however often the client retries — on the stores that hold in the run's situation",
			GoNote:     "the stores differ in where the decision lives: a mutex in one heap, SET NX in Redis, a unique index inside the charge's transaction",
		},
	})
}

// The multi-language lab's case and stack, for its clients.
const (
	peerCase  = "16 - Idempotency and duplicate effects"
	peerStack = "Go (Echo, PostgreSQL, Redis)"
)

func (s *Server) matrix(c echo.Context) error {
	if err := s.requireFaults(); err != nil {
		return err
	}
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	format, err := q.Choice("format", "json", "json", "markdown", "table", "ndjson")
	if err != nil {
		return err
	}
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	if format == "ndjson" {
		return s.streamMatrix(c, who.Identity)
	}
	m, err := s.deps.Service.Matrix(c.Request().Context(), who.Identity, nil)
	if err != nil {
		return err
	}
	return writeMatrix(c, format, m)
}

// streamMatrix answers the matrix as it runs, one JSON line per event: the
// layout first ({"stores", "cases", "total"}), then each cell as it is
// decided ({"done", "case", "cell"}), then {"wall_ms"} — or {"error"} with
// the problem that stopped it, since the status line is long gone by then.
func (s *Server) streamMatrix(c echo.Context, id tenants.Identity) error {
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	line := func(v any) {
		_ = enc.Encode(v) // a client that left ends the run through its context
		w.Flush()
	}
	stores := s.deps.Variants.Names()
	cases := experiment.Cases()
	line(matrixLayout{Stores: stores, Cases: cases, Total: len(stores) * len(cases)})
	m, err := s.deps.Service.Matrix(c.Request().Context(), id, func(done, total int, cs experiment.Case, cell experiment.Cell) {
		line(matrixProgress{Done: done, Total: total, Case: cs.Name, Cell: cell})
	})
	if err != nil {
		p, _ := toProblem(err, c.Request().Context().Err() != nil)
		s.log.ErrorContext(c.Request().Context(), "matrix stopped", "code", p.code, "err", err)
		line(matrixFailure{Error: p.problem()})
		return nil
	}
	line(matrixDone{WallMS: m.WallMS})
	return nil
}
