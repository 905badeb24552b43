package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/testsignal"
	"github.com/idempotency-lab/lab/variants"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
	"github.com/idempotency-lab/lab/variants/unsafestore"
)

// Every lab, replica, relay, sweeper and pool a test starts must stop on Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(labtest.WithServices(m)) }

// idempotentStores are the stores every contract test covers.
var idempotentStores = []lab.StoreName{memory.Name, redis.Name, postgres.Name}

// fireCharges sends n identical charges at once, released together.
func fireCharges(t *testing.T, base string, store lab.StoreName, token, key, run, body string, n int) []labtest.Reply {
	t.Helper()
	replies := make([]labtest.Reply, n)
	errs := make([]error, n)
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer client.CloseIdleConnections()
	for i := range n {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			req, _ := http.NewRequest(http.MethodPost, base+"/charges?store="+string(store), strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("Lab-Run", run)
			ready.Done()
			<-release
			resp, err := client.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			replies[i] = labtest.Reply{Status: resp.StatusCode, Header: resp.Header, Body: b.Bytes()}
		}()
	}
	ready.Wait()
	close(release)
	done.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("request failed: %v", err)
		}
	}
	return replies
}

// idempotentStores are the stores under test: memory always, the others
// when their services are configured (see storeConfig).
func TestConcurrentRetriesChargeOnce(t *testing.T) {
	t.Parallel()
	for _, store := range idempotentStores {
		t.Run(string(store), func(t *testing.T) {
			a := labtest.Start(t, e2e.StoreConfig(t, store))
			e2e.OpenRun(t, a, "run-50-"+string(store))
			replies := fireCharges(t, a.URL(), store, labtest.Acme, "k-"+string(store)+"-50", "run-50-"+string(store), e2e.Body2500, 50)
			var first []byte
			fresh, replayed, inProgress := 0, 0, 0
			for _, r := range replies {
				switch {
				case r.Status == http.StatusCreated && r.Header.Get("Idempotent-Replayed") != "true":
					fresh++
					first = r.Body
				case r.Status == http.StatusCreated:
					replayed++
				case r.Status == http.StatusConflict:
					inProgress++
					if r.Header.Get("Retry-After") == "" || labtest.Decode[lab.Problem](t, r).Code != "idempotency_in_progress" {
						t.Errorf("409 %s (Retry-After %q)", r.Body, r.Header.Get("Retry-After"))
					}
				default:
					t.Errorf("unexpected reply %d %s", r.Status, r.Body)
				}
			}
			if fresh != 1 || fresh+replayed+inProgress != 50 {
				t.Fatalf("fresh=%d replayed=%d inProgress=%d, want 1 fresh", fresh, replayed, inProgress)
			}
			for _, r := range replies {
				if r.Status == http.StatusCreated && !bytes.Equal(r.Body, first) {
					t.Errorf("replay differs:\n%s\n%s", r.Body, first)
				}
			}
			s := e2e.RunStats(t, a, "run-50-"+string(store))
			if s.Charges != 1 || s.OutboxEvents != 1 {
				t.Fatalf("ledger: %d charges, %d outbox events; want 1 and 1", s.Charges, s.OutboxEvents)
			}
			state := labtest.Decode[stateReply](t, labtest.Do(t, http.MethodGet, a.URL()+"/idempotency/state?store="+string(store), nil, ""))
			if keys := state.Stores[store].Total; keys != 1 {
				t.Fatalf("%v key rows, want 1", keys)
			}
		})
	}
}

func TestUnsafeChargesEveryAttempt(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	e2e.OpenRun(t, a, "run-unsafe")
	replies := fireCharges(t, a.URL(), unsafestore.Name, labtest.Acme, "k-unsafe", "run-unsafe", e2e.Body2500, 50)
	for _, r := range replies {
		if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("reply %d replayed=%q", r.Status, r.Header.Get("Idempotent-Replayed"))
		}
	}
	s := e2e.RunStats(t, a, "run-unsafe")
	got, err := a.Provider().Stats(t.Context(), provider.Filter{Run: "run-unsafe"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Charges != 50 || s.OutboxEvents != 0 || got.DirectCaptures != 50 || got.CapturesApplied != 50 || got.Receipts != 50 {
		t.Fatalf("ledger %+v, provider %+v; want 50 charges, each captured and receipted directly at the provider", s, got.Stats)
	}
}

func TestKeyReusedWithOtherPayload(t *testing.T) {
	t.Parallel()
	for _, store := range idempotentStores {
		t.Run(string(store), func(t *testing.T) {
			a := labtest.Start(t, e2e.StoreConfig(t, store))
			if r := labtest.Charge(t, a.URL(), store, labtest.Acme, "k-reuse", e2e.Body2500); r.Status != http.StatusCreated {
				t.Fatalf("first: %d %s", r.Status, r.Body)
			}
			r := labtest.Charge(t, a.URL(), store, labtest.Acme, "k-reuse", `{"account":"acct-1","amount_cents":9999}`)
			if r.Status != http.StatusUnprocessableEntity || labtest.Decode[lab.Problem](t, r).Code != "idempotency_key_reused" ||
				r.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("reuse: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
			}
			if n := e2e.KeyCharges(t, a, "acme", store, "k-reuse"); n != 1 {
				t.Fatalf("ledger holds %d charges for the key, want 1", n)
			}
			// Field order, whitespace and the default currency do not change the fingerprint.
			r = labtest.Charge(t, a.URL(), store, labtest.Acme, "k-reuse", ` { "amount_cents" : 2500 , "account":"acct-1" }`)
			if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("reordered body: %d %s", r.Status, r.Body)
			}
		})
	}
}

func TestBadRequestsChangeNothing(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	cases := []struct {
		name, key, body, code, param string
	}{
		{"MissingKey", "", e2e.Body2500, "idempotency_key_missing", ""},
		{"LongKey", strings.Repeat("k", 256), e2e.Body2500, "invalid_parameter", "Idempotency-Key"},
		{"ControlCharInKey", "a\tb", e2e.Body2500, "invalid_parameter", "Idempotency-Key"},
		{"MalformedJSON", "k-bad", `{"account":`, "invalid_parameter", "body"},
		{"NegativeAmount", "k-bad", `{"account":"acct-1","amount_cents":-5}`, "invalid_parameter", "amount_cents"},
		{"ZeroAmount", "k-bad", `{"account":"acct-1","amount_cents":0}`, "invalid_parameter", "amount_cents"},
		{"StringAmount", "k-bad", `{"account":"acct-1","amount_cents":"abc"}`, "invalid_parameter", "amount_cents"},
		{"FractionAmount", "k-bad", `{"account":"acct-1","amount_cents":25.5}`, "invalid_parameter", "amount_cents"},
		{"OverflowAmount", "k-bad", `{"account":"acct-1","amount_cents":99999999999999999999}`, "invalid_parameter", "amount_cents"},
		{"TooLargeAmount", "k-bad", `{"account":"acct-1","amount_cents":10000001}`, "invalid_parameter", "amount_cents"},
		{"UnknownField", "k-bad", `{"account":"acct-1","amount_cents":1,"tip":5}`, "invalid_parameter", "tip"},
		{"MissingAccount", "k-bad", `{"amount_cents":100}`, "invalid_parameter", "account"},
		{"BadCurrency", "k-bad", `{"account":"acct-1","amount_cents":100,"currency":"US"}`, "invalid_parameter", "currency"},
		{"TwoObjects", "k-bad", e2e.Body2500 + e2e.Body2500, "invalid_parameter", "body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := labtest.Charge(t, a.URL(), memory.Name, labtest.Acme, tc.key, tc.body)
			p := labtest.Decode[lab.Problem](t, r)
			if r.Status != http.StatusBadRequest || p.Code != tc.code || (tc.param != "" && p.Param != tc.param) {
				t.Fatalf("got %d %s", r.Status, r.Body)
			}
			if r.Header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("content type %q", r.Header.Get("Content-Type"))
			}
		})
	}
	if s, _ := a.Books().Summary(context.Background(), ""); len(s) != 0 {
		t.Fatalf("bad requests charged: %+v", s)
	}
	// Validation failures are never stored: the same key still works.
	if r := labtest.Charge(t, a.URL(), memory.Name, labtest.Acme, "k-bad", e2e.Body2500); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("valid request after bad ones: %d %s", r.Status, r.Body)
	}
}

func TestAuthAndStoreErrors(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	if r := labtest.Charge(t, a.URL(), memory.Name, "nope", "k", e2e.Body2500); r.Status != http.StatusUnauthorized || labtest.Decode[lab.Problem](t, r).Code != "unauthorized" {
		t.Fatalf("unknown token: %d %s", r.Status, r.Body)
	}
	if r := labtest.Charge(t, a.URL(), "sqlite", labtest.Acme, "k", e2e.Body2500); r.Status != http.StatusBadRequest || labtest.Decode[lab.Problem](t, r).Param != "store" {
		t.Fatalf("unknown store: %d %s", r.Status, r.Body)
	}
	r := labtest.Charge(t, a.URL(), redis.Name, labtest.Acme, "k", e2e.Body2500)
	if r.Status != http.StatusServiceUnavailable || labtest.Decode[lab.Problem](t, r).Code != "store_unavailable" || !strings.Contains(string(r.Body), "REDIS_URL") {
		t.Fatalf("unconfigured store: %d %s", r.Status, r.Body)
	}
	if s, _ := a.Books().Summary(context.Background(), ""); len(s) != 0 {
		t.Fatalf("rejected requests charged: %+v", s)
	}
}

func TestTenantsAreIsolated(t *testing.T) {
	t.Parallel()
	for _, store := range idempotentStores {
		t.Run(string(store), func(t *testing.T) {
			a := labtest.Start(t, e2e.StoreConfig(t, store))
			acme := labtest.Charge(t, a.URL(), store, labtest.Acme, "shared-key", e2e.Body2500)
			globex := labtest.Charge(t, a.URL(), store, labtest.Globex, "shared-key", `{"account":"acct-1","amount_cents":700}`)
			if acme.Status != http.StatusCreated || globex.Status != http.StatusCreated || globex.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("acme %d, globex %d %s", acme.Status, globex.Status, globex.Body)
			}
			if bytes.Equal(acme.Body, globex.Body) || labtest.Decode[lab.Charge](t, globex).AmountCents != 700 {
				t.Fatalf("globex got acme's response: %s", globex.Body)
			}
			again := labtest.Charge(t, a.URL(), store, labtest.Globex, "shared-key", `{"account":"acct-1","amount_cents":700}`)
			if !bytes.Equal(again.Body, globex.Body) {
				t.Fatalf("globex replay %s, want its own %s", again.Body, globex.Body)
			}
			if e2e.KeyCharges(t, a, "acme", store, "shared-key") != 1 || e2e.KeyCharges(t, a, "globex", store, "shared-key") != 1 {
				t.Fatal("want one charge per tenant")
			}
		})
	}
}

func TestKeyIsNewAfterWindow(t *testing.T) {
	t.Parallel()
	for _, store := range idempotentStores {
		t.Run(string(store), func(t *testing.T) {
			clock := labtest.NewClock(time.Now())
			cfg := e2e.StoreConfig(t, store)
			cfg.Window, cfg.Clock = time.Second, clock.Now
			a := labtest.Start(t, cfg)
			first := labtest.Charge(t, a.URL(), store, labtest.Acme, "k-window", e2e.Body2500)
			replay := labtest.Charge(t, a.URL(), store, labtest.Acme, "k-window", e2e.Body2500)
			if first.Status != http.StatusCreated || replay.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("first %d, replay %q", first.Status, replay.Header.Get("Idempotent-Replayed"))
			}
			clock.Advance(2 * time.Second) // memory and postgres expire keys by the lab's clock
			if store == redis.Name {
				e2e.WaitKeyState(t, a.URL(), labtest.Acme, store, "k-window", lab.KeyAbsent) // Redis by its own TTL
			}
			late := labtest.Charge(t, a.URL(), store, labtest.Acme, "k-window", e2e.Body2500)
			if late.Status != http.StatusCreated || late.Header.Get("Idempotent-Replayed") != "" || bytes.Equal(late.Body, first.Body) {
				t.Fatalf("after the window: %d replayed=%q", late.Status, late.Header.Get("Idempotent-Replayed"))
			}
			if n := e2e.KeyCharges(t, a, "acme", store, "k-window"); n != 2 {
				t.Fatalf("ledger holds %d charges, want 2 (the documented contract)", n)
			}
		})
	}
}

func TestLabRoutes(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	unsafeRun := labtest.Get[experiment.Report](t, a.URL()+"/charge-unsafe?attempts=5", "")
	if unsafeRun.ChargesApplied != 5 || unsafeRun.OverchargedCents != 10000 || unsafeRun.Verdict != lab.Breaks {
		t.Fatalf("unsafe run: %+v", unsafeRun)
	}
	idem := labtest.Get[experiment.Report](t, a.URL()+"/charge-idempotent?attempts=5", "")
	if idem.ChargesApplied != 1 || idem.DuplicatesPrevented != 4 || idem.Verdict != lab.Holds {
		t.Fatalf("idempotent run: %+v", idem)
	}
	if idem.ExpectedCharges != 1 || idem.RunChargedCents != 2500 || idem.AccountBalanceCents != idem.BalanceCents {
		t.Fatalf("idempotent run's figures: expected %d, run charged %d, account %d / %d",
			idem.ExpectedCharges, idem.RunChargedCents, idem.AccountBalanceCents, idem.BalanceCents)
	}
	again := labtest.Get[experiment.Report](t, a.URL()+"/charge-idempotent?attempts=5", "")
	if again.ChargesApplied != 0 || again.IdempotencyHits != 5 || again.Verdict != lab.Holds {
		t.Fatalf("repeated run: %+v", again)
	}
	if again.ExpectedCharges != 0 || again.RunChargedCents != 0 {
		t.Fatalf("a run on a charged key should add nothing: expected %d, charged %d cents", again.ExpectedCharges, again.RunChargedCents)
	}
	if n := e2e.KeyCharges(t, a, "acme", memory.Name, "order-4711"); n != 1 {
		t.Fatalf("ledger: %d memory charges for order-4711, want 1", n)
	}
	for _, q := range []struct{ query, param string }{
		{"attempts=0", "attempts"}, {"attempts=65", "attempts"}, {"amount=abc", "amount"}, {"amount=-5", "amount"},
		{"amount=10000001", "amount"}, {"key=" + strings.Repeat("x", 256), "key"}, {"store=nope", "store"},
		{"replicas=9", "replicas"}, {"fault=meteor", "fault"}, {"key=", "key"}, {"attempts=%2B5", "attempts"}, {"account=%00", "account"},
	} {
		r := labtest.Do(t, http.MethodGet, a.URL()+"/charge-idempotent?"+q.query, nil, "")
		p := labtest.Decode[lab.Problem](t, r)
		ranged := q.param != "store" && q.param != "fault" // the others name their allowed range
		if r.Status != http.StatusBadRequest || p.Param != q.param || ranged && !strings.Contains(p.Detail, "..") {
			t.Errorf("%s: %d %s", q.query, r.Status, r.Body)
		}
	}
	if n := e2e.KeyCharges(t, a, "acme", memory.Name, "order-4711"); n != 1 {
		t.Fatalf("bad parameters charged: %d", n)
	}
	state := labtest.Decode[stateReply](t, labtest.Do(t, http.MethodGet, a.URL()+"/idempotency/state?limit=1", nil, ""))
	if mem := state.Stores[memory.Name]; mem.Total != 1 || len(mem.Keys) != 1 {
		t.Fatalf("state: %+v", state)
	}
	sum := labtest.Decode[summaryReply](t, labtest.Do(t, http.MethodGet, a.URL()+"/diagnostics/summary", nil, ""))
	if len(sum.RecentRuns) != 3 {
		t.Fatalf("summary: %+v", sum)
	}
	r := labtest.Do(t, http.MethodPost, a.URL()+"/reset-lab", nil, "")
	if r.Status != http.StatusOK {
		t.Fatalf("reset: %d %s", r.Status, r.Body)
	}
	if s, _ := a.Books().Summary(context.Background(), ""); len(s) != 0 {
		t.Fatalf("reset left charges: %+v", s)
	}
	if fresh := labtest.Get[experiment.Report](t, a.URL()+"/charge-idempotent?attempts=5", ""); fresh.ChargesApplied != 1 {
		t.Fatalf("after reset: %+v", fresh)
	}
}

func TestResetNeedsAdminToken(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config(func(c *app.Config) { c.AdminToken = "s3cret" }))
	labtest.Charge(t, a.URL(), memory.Name, labtest.Acme, "k", e2e.Body2500)     // acme: the public namespace
	labtest.Charge(t, a.URL(), memory.Name, labtest.Globex, "k-g", e2e.Body2500) // globex: a namespace of its own
	// Every namespace at once only with the admin token, and only as a bearer token.
	for _, h := range []http.Header{nil, {"Authorization": {"s3cret"}}, {"Authorization": {"Bearer " + labtest.Globex}}} {
		if r := labtest.Do(t, http.MethodPost, a.URL()+"/reset-lab?all=true", h, ""); r.Status != http.StatusUnauthorized {
			t.Fatalf("reset of every namespace with %v: %d", h, r.Status)
		}
	}
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/reset-lab?all=true&token=s3cret", nil, ""); r.Status != http.StatusBadRequest {
		t.Fatalf("reset with ?token=: %d", r.Status)
	}
	if e2e.KeyCharges(t, a, "acme", memory.Name, "k") != 1 || e2e.KeyCharges(t, a, "globex", memory.Name, "k-g") != 1 {
		t.Fatal("a refused reset deleted charges")
	}
	// Without a token, a reset is the public namespace's: globex keeps its charge.
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/reset-lab", nil, ""); r.Status != http.StatusOK {
		t.Fatalf("reset of the public namespace: %d %s", r.Status, r.Body)
	}
	if e2e.KeyCharges(t, a, "acme", memory.Name, "k") != 0 || e2e.KeyCharges(t, a, "globex", memory.Name, "k-g") != 1 {
		t.Fatal("the public reset reached another namespace, or kept its own charges")
	}
	h := http.Header{"Authorization": {"Bearer s3cret"}}
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/reset-lab?all=true", h, ""); r.Status != http.StatusOK {
		t.Fatalf("reset of every namespace with the admin token: %d %s", r.Status, r.Body)
	}
	if e2e.KeyCharges(t, a, "globex", memory.Name, "k-g") != 0 {
		t.Fatal("the admin's reset kept charges")
	}
	// A store restart of every namespace needs the admin too; a run's own
	// restart acts on its namespace with its own token.
	if r := labtest.Do(t, http.MethodPost, a.URL()+"/lab/restart-store?store=memory&all=true", nil, ""); r.Status != http.StatusUnauthorized {
		t.Fatalf("restart of every namespace without the admin token: %d", r.Status)
	}
	if rep := labtest.Get[experiment.Report](t, a.URL()+"/charge-idempotent?fault=store_restart&attempts=3&key=k-admin", ""); rep.Verdict != lab.Breaks || rep.KeyCharges != 2 {
		t.Fatalf("store_restart run on a lab with an admin token: %+v", rep)
	}
}

func TestBasePathAndMetrics(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config(func(c *app.Config) { c.BasePath = "/16" }))
	if !strings.HasSuffix(a.URL(), "/16") {
		t.Fatalf("URL %s", a.URL())
	}
	labtest.Get[experiment.Report](t, a.URL()+"/charge-idempotent?attempts=3", "")
	r := labtest.Do(t, http.MethodGet, a.URL()+"/metrics", nil, "")
	for _, series := range []string{
		`lab_idempotency_claims_total{store="memory"} 1`, `lab_idempotency_replays_total{store="memory"}`,
		"lab_outbox_pending", "lab_outbox_oldest_pending_seconds", `lab_charges_applied_total{store="memory"} 1`,
		"go_goroutines", "process_resident_memory_bytes",
	} {
		if !strings.Contains(string(r.Body), series) {
			t.Errorf("metrics lack %s", series)
		}
	}
	page := labtest.Do(t, http.MethodGet, a.URL()+"/", http.Header{"Accept": {"text/html"}}, "")
	if page.Status != http.StatusOK || !strings.Contains(string(page.Body), `const BASE = "/16";`) {
		t.Fatalf("page: %d, base path not set", page.Status)
	}
	if index := labtest.Decode[api.Index](t, labtest.Do(t, http.MethodGet, a.URL()+"/", nil, "")); len(index.Variants) != len(variants.Builtin()) || len(index.Stores) != len(variants.Builtin()) {
		t.Fatalf("JSON index: %+v", index)
	}
	if r := labtest.Do(t, http.MethodGet, strings.TrimSuffix(a.URL(), "/16")+"/health", nil, ""); r.Status != http.StatusNotFound {
		t.Fatalf("route outside the base path: %d", r.Status)
	}
}

func TestOutboxIsDelivered(t *testing.T) {
	t.Parallel()
	ticked := testsignal.New() // after each turn of the lab's relay
	a := labtest.Start(t, e2e.Config(func(c *app.Config) { c.Relay.Signals.Ticked = ticked }))
	labtest.Get[experiment.Report](t, a.URL()+"/charge-idempotent?attempts=5&key=k-outbox", "")
	ticked.WaitUntil(t, "the outbox delivered, one receipt", func() bool {
		ob := labtest.Get[outboxReply](t, a.URL()+"/outbox", "")
		return ob.Delivered == 1 && ob.Pending == 0 && ob.Receipts == 1
	})
}

// TestSummaryCountsOperations: the summary's duplicates are charges beyond
// the first of one operation; charges without a key are each their own.
func TestSummaryCountsOperations(t *testing.T) {
	t.Parallel()
	for _, store := range []lab.StoreName{memory.Name, postgres.Name} {
		t.Run(string(store), func(t *testing.T) {
			a := labtest.Start(t, e2e.StoreConfig(t, store))
			for i, account := range []string{"a", "b", "c"} {
				body := fmt.Sprintf(`{"account":%q,"amount_cents":%d}`, account, 100*(i+1))
				if r := labtest.Charge(t, a.URL(), unsafestore.Name, labtest.Acme, "", body); r.Status != http.StatusCreated {
					t.Fatalf("keyless charge: %d %s", r.Status, r.Body)
				}
			}
			labtest.Get[experiment.Report](t, a.URL()+"/charge-unsafe?attempts=3&key=k-sum&amount=700", "")
			sum := labtest.Decode[summaryReply](t, labtest.Do(t, http.MethodGet, a.URL()+"/diagnostics/summary", nil, ""))
			if len(sum.Stores) != 1 {
				t.Fatalf("summary: %+v", sum)
			}
			if u := sum.Stores[0]; u.ChargesApplied != 6 || u.Operations != 4 || u.DuplicatesApplied != 2 || u.OverchargedCents != 1400 {
				t.Fatalf("unsafe summary: %+v", u)
			}
		})
	}
}

// The lab routes' answers, as the tests read them.
type (
	stateReply struct {
		Stores map[lab.StoreName]struct {
			Keys  []lab.KeyState `json:"keys"`
			Total int            `json:"total"`
		} `json:"stores"`
	}
	summaryReply struct {
		Stores     []lab.StoreSummary  `json:"stores"`
		RecentRuns []experiment.Report `json:"recent_runs"`
	}
	outboxReply struct {
		lab.OutboxStats
		Receipts int `json:"receipts"`
	}
)
