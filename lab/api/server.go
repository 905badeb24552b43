// Package api serves the lab over HTTP with Echo: the charge API that every
// attempt takes, and the lab routes that run and report experiments.
package api

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
	"github.com/idempotency-lab/lab/lab/cost"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labsvc"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/relay"
	"github.com/idempotency-lab/lab/lab/tenants"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/web"
)

// Config configures one replica's HTTP server. Every field but BasePath and
// AdminToken is required.
type Config struct {
	Replica  string // name of this replica, e.g. "r1"
	BasePath string // prefix such as "/16" when behind a hub; "" for none
	// Public is who a lab route's caller without a token acts as: one
	// shared namespace, so the curl walkthrough needs no token.
	Public        tenants.Identity
	AdminToken    string        // with it, the admin may reset and restart every namespace and sees them all
	FaultsEnabled bool          // accept the Lab-Fault header and fault= runs
	DefaultStore  lab.StoreName // store of POST /charges without ?store=, and of /charge-idempotent
	Window        time.Duration // dedupe window, reported by the lab routes
	WebhookSecret []byte        // verifies the provider's webhook signatures
	StuckAfter    time.Duration // a captured charge still pending this long after is stuck (reconcile, /metrics)
	Clock         lab.Clock
	Logger        *slog.Logger
}

// Books are the reports the API reads and the reset it performs, each for
// one namespace ("" for every namespace: the admin's view).
type Books interface {
	Summary(ctx context.Context, ns lab.Namespace) ([]lab.StoreSummary, error)
	Balance(ctx context.Context, tenant, account string) (int64, error)
	// KeyCharges tallies the charges one store made under one tenant's key.
	KeyCharges(ctx context.Context, tenant string, store lab.StoreName, key string) (lab.KeyTally, error)
	Events(ctx context.Context, ns lab.Namespace, limit int) ([]lab.Event, error)
	OutboxStats(ctx context.Context, ns lab.Namespace) (lab.OutboxStats, error)
	// Requeue puts a namespace's dead or failed outbox event back to
	// pending, due now with its attempts reset. It fails with
	// lab.ErrEventNotFound, lab.ErrEventDelivered or lab.ErrEventInFlight.
	Requeue(ctx context.Context, ns lab.Namespace, id string) (lab.Event, error)
	// ApplyWebhook processes one verified provider event (once per event
	// id, in one transaction); lab.ErrUnknownCharge when the ledger does
	// not hold its charge.
	ApplyWebhook(ctx context.Context, w lab.Webhook) (lab.WebhookResult, error)
	// Payments lists a namespace's charges with their payment state.
	Payments(ctx context.Context, ns lab.Namespace, run string, limit int) ([]lab.Payment, error)
	// OpenRun registers a run in a namespace; RunNamespace tells whose a
	// run is (lab.ErrRunNotFound for none).
	OpenRun(ctx context.Context, ns lab.Namespace, run string) error
	RunNamespace(ctx context.Context, run string) (lab.Namespace, error)
	// OldestStuck is the age, since its capture, of the oldest charge
	// still pending more than after past it (zero when none).
	OldestStuck(ctx context.Context, after time.Duration) (time.Duration, error)
	Kind() string
}

// Directory resolves bearer tokens and admits attendees.
type Directory interface {
	Resolve(ctx context.Context, token string) (tenants.Identity, bool, error)
	Join(ctx context.Context, code string) (tenants.Identity, error)
}

// Check reports whether one dependency answers.
type Check struct {
	Name     string
	Describe string
	Ping     func(ctx context.Context) error
}

// Failover steps the lab's Redis pair through a failover ("hold", then
// "promote") for a namespace and returns the primary's address.
type Failover interface {
	Failover(ctx context.Context, ns lab.Namespace, step string) (string, error)
}

// Deps are what the server works with.
type Deps struct {
	Books       Books
	Directory   Directory
	Variants    *variant.Registry
	Stores      map[lab.StoreName]lab.Store // this replica's stores, one per available variant
	Unavailable map[lab.StoreName]string    // variant -> how to enable it
	Checks      []Check
	// Service is this replica's use cases (runs, the matrices, the run
	// history, the slow bound, resets); the routes are its HTTP face.
	Service  *labsvc.Service
	Failover Failover
	// RelayCounts reads the outbox relay's deliveries by outcome; nil on a
	// replica that runs no relay.
	RelayCounts func() relay.Counts
	// Provider is the payment provider, read for its own records.
	Provider ProviderRecords
	// Cost, on the replica the provider's webhooks come to, is this
	// process's count of what the lab asks of its dependencies: shown in
	// its /metrics, the webhooks it receives counted in.
	Cost *cost.Meter
}

// ProviderRecords is what the lab routes read of the payment provider:
// its own records, the ground truth of what left the lab.
type ProviderRecords interface {
	Stats(ctx context.Context, f provider.Filter) (provider.StatsReport, error)
	Captures(ctx context.Context, f provider.Filter) ([]provider.Capture, error)
}

// Server is one replica's HTTP server.
type Server struct {
	cfg     Config
	deps    Deps
	log     *slog.Logger
	metrics *metrics
	echo    *echo.Echo

	mu sync.Mutex
	// runOwners remembers whose each run is, once read from the books: a
	// run never changes namespace, and every attempt of a run asks.
	runOwners map[string]lab.Namespace
}

// maxRunOwners bounds runOwners; past it the memory starts afresh.
const maxRunOwners = 10_000

// checkRun refuses a Lab-Run that names no run the lab opened, or another
// namespace's: a run counts its own namespace's charges, and nobody can
// add theirs to it.
func (s *Server) checkRun(ctx context.Context, run string, ns lab.Namespace) error {
	s.mu.Lock()
	owner, known := s.runOwners[run]
	s.mu.Unlock()
	if !known {
		var err error
		owner, err = s.deps.Books.RunNamespace(ctx, run)
		switch {
		case errors.Is(err, lab.ErrRunNotFound):
			return lab.Invalid("Lab-Run", "names no run opened on this lab (POST /lab/runs opens one for your namespace)")
		case err != nil:
			return fmt.Errorf("%w: error reading the run: %w", lab.ErrStoreUnavailable, err)
		}
		s.mu.Lock()
		if len(s.runOwners) >= maxRunOwners {
			clear(s.runOwners)
		}
		s.runOwners[run] = owner
		s.mu.Unlock()
	}
	if owner != ns {
		return lab.Invalid("Lab-Run", "names a run of another namespace: a charge joins only a run of its own namespace")
	}
	return nil
}

// maxSlowWork bounds the work_ms of one slow attempt.
const maxSlowWork = 10 * time.Second

// New builds the server and its routes.
func New(cfg Config, deps Deps) *Server {
	s := &Server{cfg: cfg, deps: deps, log: cfg.Logger.With("replica", cfg.Replica), runOwners: map[string]lab.Namespace{}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if deps.Cost != nil {
		reg.MustRegister(deps.Cost)
	}
	s.metrics = newMetrics(reg, metricsSources{outbox: deps.Books, stores: deps.Stores, relay: deps.RelayCounts, stuck: deps.Books, stuckAfter: cfg.StuckAfter})

	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		if !c.Response().Committed {
			_ = writeProblem(c, s.log, err)
		}
	}
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // who answered, for timelines behind a front
		return func(c echo.Context) error {
			c.Response().Header().Set(experiment.ReplicaHeader, cfg.Replica)
			return next(c)
		}
	})
	e.Use(middleware.Recover()) // re-panics http.ErrAbortHandler, which drops the connection
	e.Use(limitBodies)
	// One debug line per request: method, path, status, latency. Never a body.
	e.Use(middleware.RequestLoggerWithConfig(middleware.RequestLoggerConfig{
		LogMethod: true, LogURIPath: true, LogStatus: true, LogLatency: true, HandleError: true,
		LogValuesFunc: func(c echo.Context, v middleware.RequestLoggerValues) error {
			s.log.LogAttrs(c.Request().Context(), slog.LevelDebug, "request", slog.String("method", v.Method),
				slog.String("path", v.URIPath), slog.Int("status", v.Status), slog.Duration("latency", v.Latency))
			return nil
		},
	}))
	g := e.Group(strings.TrimSuffix(cfg.BasePath, "/"))
	metricsHandler := echo.WrapHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	for _, rt := range s.routes(metricsHandler) {
		g.Match(rt.methods, rt.path, rt.handler, takes(rt.params))
	}
	s.echo = e
	return s
}

// route is one of the lab's routes and the query parameters it takes.
type route struct {
	methods []string
	path    string
	params  []string
	handler echo.HandlerFunc
}

// runParams are what a lab run takes; which fault parameters apply depends
// on the fault (lab.FaultSpecs), checked when the run is read.
var runParams = []string{"key", "account", "attempts", "amount", "replicas", "order_id", "scenario", "fault", "work_ms", "ttl_ms", "window_ms", "replication", "phase"}

// pageParams are what a link to the page may set up, each a control of its
// run form (store, compare, and the run's own), and fire=1 fires it on load.
var pageParams = []string{"store", "compare", "fire", "key", "attempts", "amount", "replicas", "order_id", "fault", "work_ms", "ttl_ms", "window_ms", "replication", "phase"}

// routes lists every route with the parameters it takes: one table the
// router, the strict query check and its fuzz target all read.
func (s *Server) routes(metricsHandler echo.HandlerFunc) []route {
	get, post, any := []string{http.MethodGet}, []string{http.MethodPost}, []string{http.MethodGet, http.MethodPost}
	return []route{
		{post, "/charges", []string{"store"}, s.stepGate(s.postCharge)},
		{get, "/charges", []string{"store", "key"}, s.chargesUnderKey},
		{get, "/", pageParams, s.index},
		{get, "/health", nil, s.health},
		{get, "/ready", nil, s.ready},
		{get, "/metrics", nil, metricsHandler},
		{any, "/charge-unsafe", runParams, s.chargeUnsafe},
		{any, "/charge-idempotent", append([]string{"store"}, runParams...), s.chargeIdempotent},
		{get, "/idempotency/state", []string{"limit", "store", "key", "account"}, s.state},
		{get, "/outbox", []string{"limit"}, s.outbox},
		{post, "/outbox/:id/retry", nil, s.retryEvent},
		{get, "/diagnostics/summary", nil, s.summary},
		{any, "/reset-lab", []string{"all", "local"}, s.resetLab},
		{post, "/lab/restart-store", []string{"store", "all", "key_prefix"}, s.restartStore},
		{post, "/lab/join", nil, s.join},
		{get, "/lab/matrix", []string{"format"}, s.matrix},
		{get, "/lab/runs", []string{"limit"}, s.listRuns},
		{post, "/lab/runs", nil, s.openRun},
		{get, "/lab/runs/:id", nil, s.run},
		{get, "/lab/runs/:id/history", nil, s.runHistory},
		{get, "/lab/runs/:id/history.html", nil, s.runHistoryPage},
		{post, "/webhooks/provider", nil, s.providerWebhook},
		{get, "/lab/reconcile", []string{"run"}, s.reconcileCheck},
		{get, "/lab/effects", []string{"format"}, s.effectsMatrix},
		{any, "/lab/check", []string{"store", "format"}, s.checkDesign},
		{get, "/operations/:key", []string{"store"}, s.operation},
		{post, "/lab/failover", []string{"step"}, s.failover},
		{get, "/lab/step", nil, s.listSchedules},
		{post, "/lab/step", []string{"schedule", "play", "store", "attempts", "replicas", "fault", "ttl_ms", "window_ms", "replication", "phase"}, s.startStep},
		{get, "/lab/step/:id", nil, s.stepRun},
		{post, "/lab/step/:id/advance", []string{"attempt", "event", "schedule", "seed"}, s.advanceStep},
		{post, "/lab/step/:id/abort", nil, s.abortStep},
	}
}

// prettyParam is Echo's own: present, it indents a JSON answer.
const prettyParam = "pretty"

// takes refuses a request whose query is malformed, names a parameter the
// route does not take, or repeats one — on every route alike, before the
// handler reads anything.
func takes(params []string) echo.MiddlewareFunc {
	allowed := append([]string{prettyParam}, params...)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if err := checkQuery(c.Request().URL.RawQuery, allowed); err != nil {
				return err
			}
			return next(c)
		}
	}
}

// checkQuery is the check takes runs: the query parses, every parameter is
// allowed and given once, and pretty, if given, is empty or "true".
func checkQuery(raw string, allowed []string) error {
	q, err := wire.ParseQuery(raw)
	if err != nil {
		return err
	}
	for _, p := range []string{"tenant", "other_tenant"} {
		if _, present, _ := q.Lookup(p); present {
			return lab.Invalid(p, "is not a parameter: a run acts as the tenant of your token (none: the public namespace)")
		}
	}
	for _, p := range []string{"token", "admin_token", "access_token"} {
		if _, present, _ := q.Lookup(p); present {
			return lab.Invalid(p, "is not a parameter: a token goes in the Authorization header (Bearer), never in a URL, where logs and histories keep it")
		}
	}
	if err := q.Allow(allowed...); err != nil {
		return err
	}
	if v, present, _ := q.Lookup(prettyParam); present && v != "" && v != "true" {
		return lab.Invalid(prettyParam, "takes no value (or true): it indents the JSON answer (got %q)", v)
	}
	return nil
}

// maxBody bounds every request body; the charge API needs far less.
const maxBody = 64 << 10

// limitBodies refuses chunked bodies (411: a body must say its length, which
// also settles a request that carries both Content-Length and
// Transfer-Encoding) and bodies over maxBody, before anything reads them.
func limitBodies(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if len(r.TransferEncoding) > 0 || r.ContentLength > maxBody {
			// Answer at once and close: reading the rest would wait on the client.
			c.Response().Header().Set(echo.HeaderConnection, "close")
		}
		switch {
		case len(r.TransferEncoding) > 0:
			return problem(http.StatusLengthRequired, "length_required", "Length required",
				"send the body with a Content-Length header; chunked bodies are not accepted")
		case r.ContentLength > maxBody:
			return problem(http.StatusRequestEntityTooLarge, "body_too_large", "Body too large",
				fmt.Sprintf("the body is %d bytes; at most %d are accepted", r.ContentLength, maxBody))
		}
		r.Body = http.MaxBytesReader(c.Response(), r.Body, maxBody)
		return next(c)
	}
}

// Handler is the server's http.Handler.
func (s *Server) Handler() http.Handler { return s.echo }

// pickStore resolves ?store=.
func (s *Server) pickStore(raw string) (lab.Store, error) {
	name := lab.StoreName(raw)
	if name == "" {
		name = s.cfg.DefaultStore
	}
	return s.deps.Service.Store(name)
}

// storeList names every registered store, for error messages.
func (s *Server) storeList() string {
	names := s.deps.Variants.Names()
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = string(n)
	}
	return strings.Join(out, ", ")
}

// caller is who sent a request: a tenant of a namespace, or the admin.
type caller struct {
	tenants.Identity
	admin bool
}

// who resolves the request's bearer token. Without one, a lab route acts in
// the public namespace (anonymous); the charge API always needs a tenant.
func (s *Server) who(r *http.Request, anonymous bool) (caller, error) {
	h := r.Header.Get("Authorization")
	if h == "" && anonymous {
		return caller{Identity: s.cfg.Public}, nil
	}
	token, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || token == "" {
		return caller{}, errUnauthorized
	}
	if s.cfg.AdminToken != "" && subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.AdminToken)) == 1 {
		if !anonymous {
			return caller{}, errUnauthorized // the admin is no tenant: it charges nobody
		}
		return caller{Identity: s.cfg.Public, admin: true}, nil // it runs in public, and sees everything
	}
	id, found, err := s.deps.Directory.Resolve(r.Context(), token)
	switch {
	case err != nil:
		return caller{}, fmt.Errorf("%w: error resolving the token: %w", lab.ErrStoreUnavailable, err)
	case !found:
		return caller{}, errUnauthorized
	}
	return caller{Identity: id}, nil
}

// view is the namespace a report shows: the caller's, or every one for the
// admin.
func (c caller) view() lab.Namespace {
	if c.admin {
		return ""
	}
	return c.Namespace
}

// postCharge is POST /charges, the path every attempt takes.
func (s *Server) postCharge(c echo.Context) error {
	r := c.Request()
	q, err := wire.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return err
	}
	store, err := q.Name("store", "")
	if err != nil {
		return err
	}
	st, err := s.pickStore(store)
	if err != nil {
		return err
	}
	who, err := s.who(r, false)
	if err != nil {
		return err
	}
	tenant := who.Tenant
	key, hasKey, err := wire.ParseKeyHeader(r.Header.Values(lab.KeyHeader))
	if err != nil {
		return err
	}
	v, _ := s.deps.Variants.Get(st.Name())
	if !hasKey && v.RequiresKey {
		return errKeyMissing
	}
	if hasKey {
		c.Response().Header().Set(lab.KeyHeader, wire.FormatKeyHeader(key))
	}
	var faults lab.Faults
	fault, err := wire.OneField(lab.FaultHeader, r.Header.Values(lab.FaultHeader))
	if err != nil {
		return err
	}
	if fault != "" {
		if !s.cfg.FaultsEnabled {
			return lab.Invalid(lab.FaultHeader, "fault injection is disabled on this server")
		}
		if faults, err = lab.ParseFaults(fault); err != nil {
			return err
		}
		if faults.Pauses() {
			if faults.Work > maxSlowWork {
				return lab.Invalid(lab.FaultHeader, "work_ms must be at most %d on this shared lab", maxSlowWork.Milliseconds())
			}
			release, err := s.deps.Service.AdmitSlow(who.Namespace)
			if err != nil {
				return err
			}
			defer release()
		}
		if faults.Replication != "" { // a pg_failover run's attempt: it charges on the lab's PostgreSQL pair
			if st, err = s.deps.Service.PairStore(r.Context(), st.Name()); err != nil {
				return err
			}
		}
	}
	run, err := wire.OneField("Lab-Run", r.Header.Values("Lab-Run"))
	if err != nil {
		return err
	}
	if run != "" {
		if err := lab.CheckText("Lab-Run", run, 64); err != nil {
			return err
		}
		if err := s.checkRun(r.Context(), run, who.Namespace); err != nil {
			return err
		}
	}
	req, err := wire.ParseChargeRequest(r.Body)
	if err != nil {
		return err
	}
	a := lab.Attempt{
		Scope:   lab.Scope{Namespace: who.Namespace, Tenant: tenant, Endpoint: lab.Endpoint, Key: key},
		Request: req, Fingerprint: req.Fingerprint(), Run: run, Replica: s.cfg.Replica,
		Store: st.Name(), Faults: faults,
	}
	began := time.Now()
	phases := lab.NewPhases(began)
	ctx := lab.WithPhases(r.Context(), phases)
	out, err := st.Charge(ctx, a)
	s.metrics.observe(st.Name(), out, err, time.Since(began))
	// Commit and replay are the store's marks, where it made the response visible or read it.
	if timing := phases.ServerTiming(); timing != "" {
		c.Response().Header().Set("Server-Timing", timing)
	}
	if err != nil {
		if errors.Is(err, lab.ErrCrash) {
			s.log.InfoContext(r.Context(), "injected crash: dropping the connection", "store", st.Name(), "fault", faults.Point)
			panic(http.ErrAbortHandler)
		}
		return err
	}
	if out.Pending != nil {
		// Still working under a live lease: 202, and where to ask.
		c.Response().Header().Set(echo.HeaderLocation, strings.TrimSuffix(s.cfg.BasePath, "/")+"/operations/"+url.PathEscape(key)+"?store="+string(st.Name()))
		c.Response().Header().Set("Retry-After", "1")
		return c.JSON(http.StatusAccepted, out.Pending)
	}
	if out.Replayed {
		c.Response().Header().Set("Idempotent-Replayed", "true")
		if out.ReplayedFrom != "" {
			c.Response().Header().Set(experiment.ReplayedFromHeader, out.ReplayedFrom)
		}
	}
	ct := echo.MIMEApplicationJSON
	if out.Response.Status >= 400 {
		ct = problemJSON
	}
	return c.Blob(out.Response.Status, ct, out.Response.Body)
}

func (s *Server) health(c echo.Context) error {
	return c.JSON(http.StatusOK, healthAnswer{Status: "ok", Replica: s.cfg.Replica, Case: peerCase, Stack: peerStack})
}

// ready reports each configured dependency.
func (s *Server) ready(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	status, deps := http.StatusOK, map[string]dependencyState{}
	for _, ch := range s.deps.Checks {
		d := dependencyState{Status: "ok", Describe: ch.Describe}
		if err := ch.Ping(ctx); err != nil {
			d.Status, d.Error = "down", err.Error()
			status = http.StatusServiceUnavailable
		}
		deps[ch.Name] = d
	}
	return c.JSON(status, readyAnswer{Replica: s.cfg.Replica, Ledger: s.deps.Books.Kind(), Dependencies: deps})
}

// index serves the page to browsers and lists the routes and stores otherwise.
func (s *Server) index(c echo.Context) error {
	if err := s.checkPageLink(c); err != nil {
		return err
	}
	if accept := c.Request().Header.Get("Accept"); strings.Contains(accept, "text/html") {
		return c.HTMLBlob(http.StatusOK, web.Page(s.cfg.BasePath))
	}
	base := strings.TrimSuffix(s.cfg.BasePath, "/")
	variants := s.variantIndex()
	byName := make(map[lab.StoreName]VariantIndex, len(variants))
	for _, v := range variants {
		byName[v.Name] = v
	}
	params := map[string][]string{}
	for _, rt := range s.routes(nil) {
		for _, m := range rt.methods {
			params[m+" "+base+rt.path] = append([]string{prettyParam}, rt.params...)
		}
	}
	return c.JSON(http.StatusOK, Index{
		RouteParams:  params,
		Lab:          "idempotency lab: why a retried charge is applied twice, and which designs stop it",
		Replica:      s.cfg.Replica,
		Ledger:       s.deps.Books.Kind(),
		DefaultStore: s.cfg.DefaultStore,
		Variants:     variants,
		Stores:       byName,
		Faults:       FaultIndex{Enabled: s.cfg.FaultsEnabled, Points: lab.FaultSpecs()},
		MaxReplicas:  s.deps.Service.Replicas().MaxReplicas(),
		Routes: []string{
			"POST " + base + "/charges?store=" + string(s.cfg.DefaultStore) + " (Idempotency-Key, Authorization: Bearer <token>)",
			"GET " + base + "/charges?store=" + string(s.cfg.DefaultStore) + "&key= (the ledger's charges under your key)",
			"GET " + base + "/charge-unsafe?key=order-4711&account=acct-1&attempts=5&amount=2500",
			"GET " + base + "/charge-idempotent?store=" + string(s.cfg.DefaultStore) + "&key=order-4711&attempts=5&amount=2500&replicas=1&fault=none",
			"GET " + base + "/idempotency/state?limit=20",
			"GET " + base + "/outbox?limit=20",
			"POST " + base + "/outbox/{event_id}/retry",
			"GET " + base + "/diagnostics/summary",
			"POST " + base + "/reset-lab",
			"GET " + base + "/lab/matrix?format=json|markdown|table|ndjson",
			"GET " + base + "/lab/runs", "GET " + base + "/lab/runs/{run_id}",
			"GET " + base + "/lab/runs/{run_id}/history", "GET " + base + "/lab/runs/{run_id}/history.html",
			"GET " + base + "/lab/effects?format=json|markdown|table",
			"GET " + base + "/lab/check?store=" + string(s.cfg.DefaultStore) + "&format=json|markdown|table",
			"GET " + base + "/lab/reconcile?run=",
			"POST " + base + "/webhooks/provider (Provider-Signature)",
			"GET " + base + "/health", "GET " + base + "/ready", "GET " + base + "/metrics",
		},
	})
}

// checkPageLink reads a link that opens the page with a run set up, as
// /?store=memory&replicas=3&fire=1, as strictly as that run would be read:
// store and compare name stores (an empty compare: one run), fire is 0 or
// 1, and the rest are the run's own parameters.
func (s *Server) checkPageLink(c echo.Context) error {
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil || len(q.Names()) == 0 {
		return err
	}
	if _, err := q.Int("fire", 0, 0, 1); err != nil {
		return err
	}
	if compare, present, _ := q.Lookup("compare"); present && compare != "" {
		if _, err := s.storeParam(q, "compare"); err != nil {
			return err
		}
	}
	store, err := s.storeParam(q, "store")
	if err != nil {
		return err
	}
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	_, _, err = s.parseSpec(c, store, who.Identity)
	return err
}

// storeParam reads a registered store's name (default: the default store).
func (s *Server) storeParam(q wire.Query, param string) (lab.StoreName, error) {
	raw, err := q.Name(param, string(s.cfg.DefaultStore))
	if err != nil {
		return "", err
	}
	if _, ok := s.deps.Variants.Get(lab.StoreName(raw)); !ok {
		return "", lab.Invalid(param, "must be one of %s (got %q)", s.storeList(), raw)
	}
	return lab.StoreName(raw), nil
}

// Index is the JSON answer of GET /: what the page builds its controls from.
type Index struct {
	Lab          string         `json:"lab"`
	Replica      string         `json:"replica"`
	Ledger       string         `json:"ledger"`
	DefaultStore lab.StoreName  `json:"default_store"`
	Variants     []VariantIndex `json:"variants"`
	// Stores is the same list keyed by name, as the index has always had it.
	Stores      map[lab.StoreName]VariantIndex `json:"stores"`
	Faults      FaultIndex                     `json:"faults"`
	MaxReplicas int                            `json:"max_replicas"`
	Routes      []string                       `json:"routes"`
	// RouteParams are the query parameters each route takes ("GET /outbox":
	// limit, pretty); any other is a 400. The fault parameters of a run
	// apply as faults.points lists them.
	RouteParams map[string][]string `json:"route_params"`
}

// VariantIndex describes one registered variant and whether it runs here.
type VariantIndex struct {
	Name        lab.StoreName `json:"name"`
	Label       string        `json:"label"`
	Decides     string        `json:"decides"`
	Keys        string        `json:"keys"`
	RequiresKey bool          `json:"requires_key"`
	Effects     string        `json:"effects"` // "outbox", or "direct": the provider called inside the request
	Available   bool          `json:"available"`
	HowToEnable string        `json:"how_to_enable,omitempty"`
}

// FaultIndex lists the faults and the run parameters each one takes.
type FaultIndex struct {
	Enabled bool            `json:"enabled"`
	Points  []lab.FaultSpec `json:"points"`
}

func (s *Server) variantIndex() []VariantIndex {
	var out []VariantIndex
	for _, v := range s.deps.Variants.All() {
		vi := VariantIndex{Name: v.Name, Label: v.Label, Decides: v.Decides, Keys: v.Keys, RequiresKey: v.RequiresKey, Effects: v.Effects}
		if st, ok := s.deps.Stores[v.Name]; ok {
			vi.Available = true
			if d, ok := st.(lab.Describer); ok {
				vi.Keys = d.Describe()
			}
		} else {
			vi.HowToEnable = s.deps.Unavailable[v.Name]
		}
		out = append(out, vi)
	}
	return out
}

func (s *Server) requireFaults() error {
	if !s.cfg.FaultsEnabled {
		return problem(http.StatusForbidden, "faults_disabled", "Faults disabled", "fault injection is disabled on this server (LAB_FAULTS=on enables it)")
	}
	return nil
}

// scope reads ?all=true: every namespace, which only the admin may ask for
// (anyone, on a lab without an admin token).
func (s *Server) scope(q wire.Query, who caller) (lab.Namespace, error) {
	all, err := q.Choice("all", "false", "false", "true")
	if err != nil {
		return "", err
	}
	if all == "false" {
		return who.Namespace, nil
	}
	if s.cfg.AdminToken != "" && !who.admin {
		return "", errAdmin
	}
	return "", nil
}

// scoped reads who asks, the query, and which namespace an action that
// forgets state (a reset, a restart) may reach.
func (s *Server) scoped(c echo.Context) (caller, wire.Query, lab.Namespace, error) {
	who, err := s.who(c.Request(), true)
	if err != nil {
		return caller{}, wire.Query{}, "", err
	}
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return caller{}, wire.Query{}, "", err
	}
	ns, err := s.scope(q, who)
	return who, q, ns, err
}

func (s *Server) resetLab(c echo.Context) error {
	who, q, ns, err := s.scoped(c)
	if err != nil {
		return err
	}
	local, err := q.Choice("local", "false", "false", "true")
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	s.log.InfoContext(ctx, "reset", "namespace", nsName(ns), "asked_by", nsName(who.view()), "local", local)
	// Peers reset with local=true: the replica that was asked reaches
	// every other one itself.
	reset := s.deps.Service.ResetLocal
	if local == "false" {
		reset = func(ctx context.Context, ns lab.Namespace) error {
			return s.deps.Service.Reset(ctx, ns, c.Request().Header.Get("Authorization"))
		}
	}
	if err := reset(ctx, ns); err != nil {
		return err
	}
	what := "namespace " + string(ns) + ": its idempotency keys, ledger entries, outbox events, webhooks, the provider's captures and receipts, and runs"
	if ns == "" {
		what = "every namespace: the lab's own idempotency keys, ledger entries, outbox events, webhooks, the provider's captures and receipts, and runs"
	}
	return c.JSON(http.StatusOK, resetAnswer{
		Reset: true, Status: "reset", Namespace: string(ns),
		Message: "keys, ledger, outbox and runs of " + nsName(ns) + " deleted",
		Deleted: what + "; nothing else in the configured PostgreSQL or Redis",
		Ledger:  s.deps.Books.Kind(),
	})
}

// nsName names a namespace in logs ("" is every namespace).
func nsName(ns lab.Namespace) string {
	if ns == "" {
		return "(all)"
	}
	return string(ns)
}

func (s *Server) restartStore(c echo.Context) error {
	if err := s.requireFaults(); err != nil {
		return err
	}
	who, q, ns, err := s.scoped(c)
	if err != nil {
		return err
	}
	store, err := q.Name("store", "")
	if err != nil {
		return err
	}
	st, err := s.pickStore(store)
	if err != nil {
		return err
	}
	// key_prefix confines the restart to the namespace's keys under it (a
	// matrix cell's own), so the caller's other keys survive it.
	prefix, err := q.Text("key_prefix", "", lab.MaxKeyPrefixBytes)
	if err != nil {
		return err
	}
	if prefix != "" {
		if err := lab.CheckKeyPrefix(prefix); err != nil {
			return lab.Invalid("key_prefix", "%v", err)
		}
	}
	region := lab.Region{Namespace: ns, KeyPrefix: prefix}
	s.log.InfoContext(c.Request().Context(), "store restart", "store", st.Name(), "namespace", nsName(ns), "key_prefix", prefix, "asked_by", nsName(who.view()))
	if r, ok := st.(lab.Restarter); ok { // a store without state has nothing to lose
		if err := r.Restart(c.Request().Context(), region); err != nil {
			return fmt.Errorf("error restarting store %s: %w", st.Name(), err)
		}
	}
	return c.JSON(http.StatusOK, restartAnswer{Restarted: st.Name(), Replica: s.cfg.Replica, Namespace: string(ns), KeyPrefix: prefix})
}

// join gives an attendee a namespace of their own: POST /lab/join, with
// the workshop's code as {"code": "…"} when the instructor set one.
func (s *Server) join(c echo.Context) error {
	code, err := wire.ParseJoinRequest(c.Request().Body)
	if err != nil {
		return err
	}
	id, err := s.deps.Directory.Join(c.Request().Context(), code)
	switch {
	case errors.Is(err, tenants.ErrJoinCode):
		return problem(http.StatusForbidden, "join_code_wrong", "Wrong join code", err.Error())
	case errors.Is(err, tenants.ErrJoinClosed):
		return problem(http.StatusForbidden, "join_closed", "Join closed", err.Error())
	case err != nil:
		return fmt.Errorf("%w: %w", lab.ErrStoreUnavailable, err)
	}
	s.log.InfoContext(c.Request().Context(), "attendee joined", "namespace", id.Namespace)
	return c.JSON(http.StatusCreated, joinAnswer{
		Token: id.Token, Tenant: id.Tenant, Namespace: id.Namespace, SecondTenant: id.Second().Tenant,
		Note: "send Authorization: Bearer <token> with every request: charges, runs, faults, resets and reports then act on your namespace only",
	})
}

// CountSwept records keys the sweeper removed from one of this replica's stores.
func (s *Server) CountSwept(store lab.StoreName, n int) {
	s.metrics.swept.WithLabelValues(string(store)).Add(float64(n))
}

// operation is GET /operations/{key}?store=: the state of a keyed charge
// whose work outlives its request (in flight with its lease and fencing
// token, or completed with its answer), for the caller's tenant.
func (s *Server) operation(c echo.Context) error {
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	name, err := q.Name("store", "")
	if err != nil {
		return err
	}
	st, err := s.pickStore(name)
	if err != nil {
		return err
	}
	looker, ok := st.(lab.OperationLooker)
	if !ok {
		return lab.Invalid("store", "store %s answers every request in full; it keeps no operations to look up", st.Name())
	}
	who, err := s.who(c.Request(), false)
	if err != nil {
		return err
	}
	key := c.Param("key") // Echo hands it over unescaped
	if err := lab.CheckText("key", key, lab.MaxKeyBytes); err != nil {
		return err
	}
	op, err := looker.Operation(c.Request().Context(), lab.Scope{Namespace: who.Namespace, Tenant: who.Tenant, Endpoint: lab.Endpoint, Key: key})
	if errors.Is(err, lab.ErrOperationNotFound) {
		return problem(http.StatusNotFound, "operation_not_found", "Operation not found", "no charge of this tenant holds this key in store "+string(st.Name()))
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, op)
}

// failover is POST /lab/failover?step=hold|promote: the failover fault's
// two moves on the lab's Redis pair, which only failover runs use, so no
// other namespace's keys are touched. One failover at a time.
func (s *Server) failover(c echo.Context) error {
	if err := s.requireFaults(); err != nil {
		return err
	}
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	step, err := q.Choice("step", "", "hold", "promote")
	if err != nil {
		return err
	}
	if step == "" {
		return lab.Invalid("step", "is required: hold, then promote")
	}
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	primary, err := s.deps.Failover.Failover(c.Request().Context(), who.Namespace, step)
	if err != nil {
		return err
	}
	s.log.InfoContext(c.Request().Context(), "redis pair failover", "step", step, "primary", primary, "asked_by", nsName(who.view()))
	return c.JSON(http.StatusOK, failoverAnswer{Step: step, Namespace: string(who.Namespace)})
}
