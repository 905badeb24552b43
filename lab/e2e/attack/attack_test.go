package attack_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/tenants"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
	"github.com/idempotency-lab/lab/variants/unsafestore"
)

// The attack suite replays a hostile attendee's review of the shared lab:
// each finding is a subtest that does what the attacker did and shows it
// now stays in the attacker's namespace, or is refused. Every check reads
// the ledger (a.Books()) and the key state, not only HTTP statuses.

const (
	attackAdmin    = "attack-admin-token"
	attackJoinCode = "attack-join-code"
)

// keyedStores are the stores that keep keys.
var keyedStores = []lab.StoreName{memory.Name, redis.Name, postgres.Name}

// labAttendee is the answer of POST /lab/join.
type labAttendee struct {
	Token        string        `json:"token"`
	Tenant       string        `json:"tenant"`
	Namespace    lab.Namespace `json:"namespace"`
	SecondTenant string        `json:"second_tenant"`
}

// The lab routes' answers, with the fields the attack suite reads.
type (
	nsState struct {
		Namespace    string           `json:"namespace"`
		Account      string           `json:"account"`
		BalanceCents map[string]int64 `json:"balance_cents"`
		Stores       map[lab.StoreName]struct {
			Keys  []lab.KeyState `json:"keys"`
			Total int            `json:"total"`
		} `json:"stores"`
	}
	nsSummary struct {
		Namespace  string              `json:"namespace"`
		Stores     []lab.StoreSummary  `json:"stores"`
		RecentRuns []experiment.Report `json:"recent_runs"`
	}
	nsOutbox struct {
		Events    []lab.Event `json:"events"`
		Pending   int         `json:"outbox_pending"`
		Delivered int         `json:"outbox_delivered"`
		Dead      int         `json:"outbox_dead"`
	}
	scopeReply struct {
		Restarted lab.StoreName `json:"restarted"`
		Reset     bool          `json:"reset"`
		Namespace string        `json:"namespace"`
	}
)

// joinLab admits a new attendee with the join code.
func joinLab(t *testing.T, base, code string) labAttendee {
	t.Helper()
	r := labtest.Do(t, http.MethodPost, base+"/lab/join", http.Header{"Content-Type": {"application/json"}}, fmt.Sprintf(`{"code":%q}`, code))
	if r.Status != http.StatusCreated {
		t.Fatalf("join: %d %s", r.Status, r.Body)
	}
	at := labtest.Decode[labAttendee](t, r)
	if at.Token == "" || at.Tenant != string(at.Namespace) || at.SecondTenant != at.Tenant+lab.SecondTenantSuffix {
		t.Fatalf("join answered %+v", at)
	}
	return at
}

// freshCharge posts a charge that must be applied now (201, not a replay).
func freshCharge(t *testing.T, base string, store lab.StoreName, token, key, body string) labtest.Reply {
	t.Helper()
	r, err := labtest.SendCharge(base, store, token, key, body, nil)
	if err != nil {
		t.Fatalf("charge %s on %s: %v", key, store, err)
	}
	if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("charge %s on %s: %d replayed=%q %s", key, store, r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
	}
	return r
}

// holdWork is the slow work of charges a test needs in flight all at once
// while it acts beside them: 10 s, long enough that on a loaded machine
// the last of a flood arrives before the first is done.
const holdWork = 10000

// slowFault is a Lab-Fault header making the charge's work take ms.
func slowFault(ms int) http.Header {
	return http.Header{lab.FaultHeader: {fmt.Sprintf("slow; work_ms=%d", ms)}}
}

// doneCharge is a completed charge an attendee expects to be replayed.
type doneCharge struct {
	store      lab.StoreName
	token, key string
	reply      labtest.Reply
}

func chargeDone(t *testing.T, base string, store lab.StoreName, token, key string) doneCharge {
	t.Helper()
	return doneCharge{store: store, token: token, key: key, reply: freshCharge(t, base, store, token, key, e2e.Body2500)}
}

// replays checks that the key answers its stored response: same bytes,
// Idempotent-Replayed: true.
func (d doneCharge) replays(t *testing.T, base string) {
	t.Helper()
	r, err := labtest.SendCharge(base, d.store, d.token, d.key, e2e.Body2500, nil)
	if err != nil {
		t.Errorf("replay of %s on %s: %v", d.key, d.store, err)
		return
	}
	if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.Body, d.reply.Body) {
		t.Errorf("%s on %s no longer replays: %d replayed=%q\n got %s\nwant %s", d.key, d.store, r.Status,
			r.Header.Get("Idempotent-Replayed"), r.Body, d.reply.Body)
	}
}

func stateAs(t *testing.T, base, token string) nsState {
	t.Helper()
	return labtest.Get[nsState](t, base+"/idempotency/state?limit=200", token)
}

// ledgerOf is the ledger's summary of a namespace ("" for all of them).
func ledgerOf(t *testing.T, a *app.App, ns lab.Namespace) []lab.StoreSummary {
	t.Helper()
	s, err := a.Books().Summary(context.Background(), ns)
	if err != nil {
		t.Fatal(err)
	}
	if s == nil {
		s = []lab.StoreSummary{}
	}
	return s
}

// plus is a ledger summary with n more single charges of cents on store.
func plus(s []lab.StoreSummary, store lab.StoreName, n int, cents int64) []lab.StoreSummary {
	out := slices.Clone(s)
	i := slices.IndexFunc(out, func(x lab.StoreSummary) bool { return x.Store == store })
	if i < 0 {
		out = append(out, lab.StoreSummary{Store: store})
		slices.SortFunc(out, func(x, y lab.StoreSummary) int { return strings.Compare(string(x.Store), string(y.Store)) })
		i = slices.IndexFunc(out, func(x lab.StoreSummary) bool { return x.Store == store })
	}
	out[i].ChargesApplied += n
	out[i].Operations += n
	out[i].AmountCents += int64(n) * cents
	return out
}

func sameLedger(t *testing.T, what string, got, want []lab.StoreSummary) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: ledger\n got %+v\nwant %+v", what, got, want)
	}
}

// sent is one answer of a flood: the reply, or the transport error.
type sent struct {
	reply labtest.Reply
	err   error
}

// flood sends every request at once (released together) and delivers
// their answers, in order, on the returned channel when all are in.
func flood(t *testing.T, reqs []*http.Request) <-chan []sent {
	t.Helper()
	out := make([]sent, len(reqs))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: len(reqs)}}
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	for i, req := range reqs {
		ready.Add(1)
		done.Go(func() {
			ready.Done()
			<-release
			resp, err := client.Do(req)
			if err != nil {
				out[i].err = err
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			out[i] = sent{labtest.Reply{Status: resp.StatusCode, Header: resp.Header, Body: b}, err}
		})
	}
	ready.Wait()
	close(release)
	result := make(chan []sent, 1)
	go func() {
		done.Wait()
		client.CloseIdleConnections()
		result <- out
	}()
	return result
}

// chargeRequests builds n charges of token on store, keys prefix-0…, with extra headers.
func chargeRequests(t *testing.T, base string, store lab.StoreName, token, prefix string, n int, extra http.Header) []*http.Request {
	t.Helper()
	reqs := make([]*http.Request, n)
	for i := range reqs {
		req, err := http.NewRequest(http.MethodPost, base+"/charges?store="+string(store), strings.NewReader(e2e.Body2500))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set(lab.KeyHeader, fmt.Sprintf("%s-%d", prefix, i))
		for k, v := range extra {
			req.Header[k] = v
		}
		reqs[i] = req
	}
	return reqs
}

// claimingSessions counts the sessions holding a claim on the schema's
// idempotency_requests table: postgres-store charges in their transaction.
func claimingSessions(t *testing.T, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(DISTINCT pid) FROM pg_locks
		WHERE relation = to_regclass($1) AND mode = 'RowExclusiveLock' AND granted`, schema+".idempotency_requests").Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// nsSnapshot is what an attendee can see of their namespace.
type nsSnapshot struct {
	ledger  []lab.StoreSummary
	balance map[string]int64
	keys    map[lab.StoreName]int
	runs    []string
}

func snapshotOf(t *testing.T, a *app.App, at labAttendee) nsSnapshot {
	t.Helper()
	st := stateAs(t, a.URL(), at.Token)
	s := nsSnapshot{ledger: ledgerOf(t, a, at.Namespace), balance: st.BalanceCents, keys: map[lab.StoreName]int{}}
	for name, v := range st.Stores {
		s.keys[name] = v.Total
	}
	for _, r := range labtest.Get[nsSummary](t, a.URL()+"/diagnostics/summary", at.Token).RecentRuns {
		s.runs = append(s.runs, r.RunID)
	}
	return s
}

func TestAttack(t *testing.T) {
	t.Parallel()
	t.Run("Namespaces", func(t *testing.T) {
		t.Parallel()
		attackNamespaces(t)
	})
	t.Run("F09_SlowClientsAreClosedByTheTimeouts", func(t *testing.T) {
		t.Parallel()
		attackSlowClients(t)
	})
	t.Run("F10_StateIsNotOKeysUnderTheStoreLock", func(t *testing.T) {
		t.Parallel()
		attackManyKeys(t)
	})
	t.Run("F11_LostLedgerConnectionIsNotA500", func(t *testing.T) {
		t.Parallel()
		attackLostConnections(t)
	})
	t.Run("F12_RunsPastTheLimitAreShedNotSlowed", func(t *testing.T) {
		t.Parallel()
		attackRunFlood(t)
	})
}

// attackRunFlood (F12): a namespace runs two lab runs at once, the lab
// MaxRuns; one more of the namespace's is a 429, one more of anyone's a
// 503, both with Retry-After, and neither charges anything; the runs under
// way hold, and once they end a run is admitted again.
func attackRunFlood(t *testing.T) {
	cfg := e2e.Config(func(c *app.Config) { c.MaxRuns, c.JoinCode = 3, attackJoinCode })
	a := labtest.Start(t, cfg)
	base := a.URL()
	A, B := joinLab(t, base, attackJoinCode), joinLab(t, base, attackJoinCode)
	// The runs work as long as a run may (holdWork): the test needs them in
	// flight while it sends the refused ones.
	run := func(token, key string) *http.Request {
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/charge-idempotent?store=memory&fault=slow&work_ms=%d&attempts=2&key=%s", base, holdWork, key), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		return req
	}
	results := flood(t, []*http.Request{run(A.Token, "f12-a-0"), run(A.Token, "f12-a-1"), run(B.Token, "f12-b-0")})
	labtest.Eventually(t, "three runs in flight", func() bool {
		inFlight := 0
		for _, token := range []string{A.Token, B.Token} {
			for _, k := range stateAs(t, base, token).Stores[memory.Name].Keys {
				if k.State == lab.KeyInFlight {
					inFlight++
				}
			}
		}
		return inFlight == 3
	})
	refused := []struct {
		token, tenant, key, code string
		status                   int
	}{
		{A.Token, A.Tenant, "f12-a-2", "too_many_runs", http.StatusTooManyRequests},
		{a.Public().Token, a.Public().Tenant, "f12-pub-0", "lab_busy", http.StatusServiceUnavailable},
	}
	for _, c := range refused {
		r := labtest.Do(t, http.MethodGet, run(c.token, c.key).URL.String(), labtest.Bearer(c.token), "")
		labtest.WantProblem(t, c.key, r, c.status, c.code, "")
		if r.Header.Get("Retry-After") == "" {
			t.Errorf("%s: %d without Retry-After", c.key, r.Status)
		}
	}
	for i, s := range <-results {
		if s.err != nil || s.reply.Status != http.StatusOK {
			t.Fatalf("run %d under way: %v %d %s", i, s.err, s.reply.Status, s.reply.Body)
		}
		if rep := labtest.Decode[experiment.Report](t, s.reply); rep.KeyCharges != 1 {
			t.Errorf("run %d under way charged its key %d times", i, rep.KeyCharges)
		}
	}
	for _, c := range refused {
		if n := e2e.KeyCharges(t, a, c.tenant, memory.Name, c.key); n != 0 {
			t.Errorf("the refused run %s charged %d times", c.key, n)
		}
	}
	r := labtest.Do(t, http.MethodGet, base+"/charge-idempotent?store=memory&attempts=2&key=f12-pub-1", nil, "")
	if rep := labtest.Decode[experiment.Report](t, r); r.Status != http.StatusOK || rep.KeyCharges != 1 {
		t.Errorf("a run once the others ended: %d %s", r.Status, r.Body)
	}
}

// attackNamespaces runs findings 1–8 and the closing property side by side,
// each against a lab of its own with real PostgreSQL and Redis, an admin
// token, two attendees and the public namespace, each holding completed
// keys and runs (newNSAttack).
func attackNamespaces(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(*testing.T, *nsAttack)
	}{
		{"F01_AnonymousStoreRestartActsInThePublicNamespaceOnly", attackAnonymousRestart},
		{"F02_TenantParameterCannotChargeAnotherTenant", attackTenantParameter},
		{"F03_CrashInOneNamespaceKeepsAnothersKeys", attackCrashInOneNamespace},
		{"F04_SlowFloodCannotStarveAnotherNamespace", attackSlowFlood},
		{"F05_ReportsShowOnlyTheCallersNamespace", attackReports},
		{"F06_ControlBytesInParametersAre400", attackControlBytes},
		{"F07_MalformedBodiesChargeNothing", attackMalformedBodies},
		{"F08_AdminTokenOnlyAsBearer", attackAdminToken},
		{"ClosingProperty_BsWorstLeavesAUntouched", attackClosingProperty},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newNSAttack(t))
		})
	}
}

// nsAttack is the lab the namespace findings attack, and what they share.
type nsAttack struct {
	cfg  app.Config
	a    *app.App
	base string
	pool *pgxpool.Pool // the test's own, for what only the database can tell
	A, B labAttendee   // two attendees, each in a namespace of their own
	pub  tenants.Identity
	// A completed charge of each namespace on every keyed store, which
	// must go on replaying.
	aDone, bDone, pubDone []doneCharge
}

// newNSAttack starts the lab, admits A and B with the join code (a wrong
// one is refused), and gives every namespace completed keys on every
// keyed store, and runs.
func newNSAttack(t *testing.T) *nsAttack {
	cfg := e2e.FullConfig(t)
	// The findings attack the keyless design and the keyed stores alone: the
	// closing property's matrix has their columns, not every design's.
	cfg.Variants = slices.DeleteFunc(cfg.Variants, func(v variant.Variant) bool {
		return v.Name != unsafestore.Name && !slices.Contains(keyedStores, v.Name)
	})
	cfg.AdminToken, cfg.JoinCode = attackAdmin, attackJoinCode
	// A small pool: the postgres store lets a namespace hold pool/4 = 2
	// connections of a replica, and waits InFlightWait for one.
	cfg.PGPoolSize, cfg.InFlightWait = 8, 2*time.Second
	a := labtest.Start(t, cfg)
	base := a.URL()
	pool := e2e.Pool(t, cfg.DatabaseURL)
	A, B := joinLab(t, base, attackJoinCode), joinLab(t, base, attackJoinCode)
	pub := a.Public()
	labtest.WantProblem(t, "join with a wrong code", labtest.Do(t, http.MethodPost, base+"/lab/join", nil, `{"code":"guess"}`),
		http.StatusForbidden, "join_code_wrong", "")

	// Every namespace holds completed keys on every store, and runs.
	var aDone, bDone, pubDone []doneCharge
	for _, store := range keyedStores {
		aDone = append(aDone, chargeDone(t, base, store, A.Token, "a-done-"+string(store)))
		bDone = append(bDone, chargeDone(t, base, store, B.Token, "b-done-"+string(store)))
		pubDone = append(pubDone, chargeDone(t, base, store, pub.Token, "pub-done-"+string(store)))
	}
	for i, at := range []labAttendee{A, A, B} {
		r := labtest.Do(t, http.MethodGet, fmt.Sprintf("%s/charge-idempotent?store=postgres&attempts=3&key=run-%d", base, i), labtest.Bearer(at.Token), "")
		if rep := labtest.Decode[experiment.Report](t, r); r.Status != http.StatusOK || rep.Tenant != at.Tenant {
			t.Fatalf("run as %s: %d %s", at.Tenant, r.Status, r.Body)
		}
	}
	labtest.Get[experiment.Report](t, base+"/charge-idempotent?attempts=3&key=pub-run", "") // the public namespace's
	return &nsAttack{cfg: cfg, a: a, base: base, pool: pool, A: A, B: B, pub: pub, aDone: aDone, bDone: bDone, pubDone: pubDone}
}

// attackAnonymousRestart (F01): a caller without a token restarts stores
// in the public namespace only, by store_restart runs on every store and
// by route (the closing property runs a matrix, restarts included, as B).
// A's charges in flight on memory and postgres live through it (its
// PostgreSQL session is not terminated) and are charged once; A's and B's completed keys still replay; what is lost
// is the public namespace's own memory and redis keys; restarting every
// namespace at once needs the admin token.
func attackAnonymousRestart(t *testing.T, f *nsAttack) {
	a, base, A, B, pub := f.a, f.base, f.A, f.B, f.pub
	ctx := context.Background()
	aBefore, bBefore := ledgerOf(t, a, A.Namespace), ledgerOf(t, a, B.Namespace)
	// A has charges in flight on memory and postgres while the anonymous
	// restarts happen.
	inflight := make(chan sent, 2)
	for _, store := range []lab.StoreName{memory.Name, postgres.Name} {
		go func() {
			r, err := labtest.SendCharge(base, store, A.Token, "a-f01-inflight", e2e.Body2500, slowFault(3000))
			inflight <- sent{r, err}
		}()
	}
	e2e.WaitKeyState(t, base, A.Token, memory.Name, "a-f01-inflight", lab.KeyInFlight)
	var aSession int32 // the PostgreSQL session of A's charge in flight
	labtest.Eventually(t, "A's postgres charge claiming its key", func() bool {
		return f.pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE relation = to_regclass($1) AND mode = 'RowExclusiveLock' AND granted LIMIT 1`,
			f.cfg.PGSchema+".idempotency_requests").Scan(&aSession) == nil
	})
	for _, store := range []lab.StoreName{postgres.Name, memory.Name, redis.Name} {
		key := "x-" + string(store)
		rep := labtest.Get[experiment.Report](t, base+"/charge-idempotent?store="+string(store)+"&fault=store_restart&key="+key, "")
		want := 2 // memory and redis forget the public namespace's key: the lesson
		if store == postgres.Name {
			want = 1
			var alive bool
			if err := f.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, aSession).Scan(&alive); err != nil || !alive {
				t.Errorf("the public namespace's postgres restart terminated A's session %d (%v)", aSession, err)
			}
		}
		if n := e2e.KeyCharges(t, a, pub.Tenant, store, key); rep.Tenant != pub.Tenant || n != want {
			t.Errorf("anonymous store_restart run on %s: tenant %q, %d charges for %s, want %s and %d", store, rep.Tenant, n, key, pub.Tenant, want)
		}
	}
	r := labtest.Do(t, http.MethodPost, base+"/lab/restart-store?store=memory", nil, "")
	if got := labtest.Decode[scopeReply](t, r); r.Status != http.StatusOK || got.Namespace != string(pub.Namespace) {
		t.Errorf("anonymous restart: %d %s", r.Status, r.Body)
	}
	labtest.WantProblem(t, "anonymous restart of every namespace", labtest.Do(t, http.MethodPost, base+"/lab/restart-store?store=memory&all=true", nil, ""),
		http.StatusUnauthorized, "admin_token_required", "")
	for range 2 {
		if res := <-inflight; res.err != nil || res.reply.Status != http.StatusCreated {
			t.Fatalf("A's in-flight charge: %v %d %s", res.err, res.reply.Status, res.reply.Body)
		}
	}
	for _, store := range []lab.StoreName{memory.Name, postgres.Name} {
		if st := e2e.KeyState(t, base, A.Token, store, "a-f01-inflight"); st != lab.KeyCompleted {
			t.Errorf("A's %s charge in flight during the public restarts is %s afterwards, want completed", store, st)
		}
		if n := e2e.KeyCharges(t, a, A.Tenant, store, "a-f01-inflight"); n != 1 {
			t.Errorf("A's %s charge in flight during the public restarts: %d charges", store, n)
		}
	}
	for _, d := range slices.Concat(f.aDone, f.bDone) {
		d.replays(t, base)
	}
	// What the public restarts did lose is the public namespace's own.
	for _, d := range f.pubDone {
		if d.store == postgres.Name {
			d.replays(t, base) // a PostgreSQL restart loses no committed key
		} else if st := e2e.KeyState(t, base, "", d.store, d.key); st != lab.KeyAbsent {
			t.Errorf("the public %s key after the public restarts: %s, want absent", d.store, st)
		}
	}
	sameLedger(t, "A", ledgerOf(t, a, A.Namespace), plus(plus(aBefore, memory.Name, 1, 2500), postgres.Name, 1, 2500))
	sameLedger(t, "B", ledgerOf(t, a, B.Namespace), bBefore)
}

// attackTenantParameter (F02): tenant= and other_tenant= cannot aim a run
// at another tenant: anonymous or as an attendee, each such request is a
// 400 naming the parameter, no namespace's ledger moves, and no tenant's
// account victim holds a cent.
func attackTenantParameter(t *testing.T, f *nsAttack) {
	a, base, A, B, pub := f.a, f.base, f.A, f.B, f.pub
	ctx := context.Background()
	before := map[lab.Namespace][]lab.StoreSummary{}
	for _, ns := range []lab.Namespace{"globex", pub.Namespace, A.Namespace, B.Namespace} {
		before[ns] = ledgerOf(t, a, ns)
	}
	const victim = "account=victim&amount=10000000&attempts=64"
	for _, tc := range []struct {
		method, path, token, param string
	}{
		{http.MethodGet, "/charge-unsafe?tenant=globex&" + victim, "", "tenant"},
		{http.MethodPost, "/charge-unsafe?tenant=globex&" + victim, "", "tenant"},
		{http.MethodGet, "/charge-unsafe?tenant=globex&" + victim, A.Token, "tenant"},
		{http.MethodGet, "/charge-unsafe?tenant=&" + victim, B.Token, "tenant"},
		{http.MethodGet, "/charge-unsafe?tenant=globex&tenant=acme&" + victim, "", "tenant"},
		{http.MethodGet, "/charge-idempotent?store=postgres&tenant=globex&" + victim, A.Token, "tenant"},
		{http.MethodGet, "/charge-idempotent?store=memory&scenario=tenants&other_tenant=globex&" + victim, "", "other_tenant"},
		{http.MethodGet, "/charge-idempotent?store=redis&other_tenant=" + A.Tenant + "&" + victim, B.Token, "other_tenant"},
	} {
		r := labtest.Do(t, tc.method, base+tc.path, labtest.Bearer(tc.token), "")
		labtest.WantProblem(t, tc.method+" "+tc.path, r, http.StatusBadRequest, "invalid_parameter", tc.param)
	}
	for ns, want := range before {
		sameLedger(t, string(ns), ledgerOf(t, a, ns), want)
	}
	for _, tenant := range []string{"globex", "globex~2", pub.Tenant, A.Tenant, B.Tenant} {
		if b, err := a.Books().Balance(ctx, tenant, "victim"); err != nil || b != 0 {
			t.Errorf("%s's account victim holds %d cents (%v)", tenant, b, err)
		}
	}
}

// attackCrashInOneNamespace (F03): B's crashes on the memory store (after
// the claim, after the charge) take B's memory keys only: A's charge in
// flight meanwhile completes once and replays, and A's and the public
// namespace's memory keys still replay, their ledgers unmoved.
func attackCrashInOneNamespace(t *testing.T, f *nsAttack) {
	a, base, A, B, pub := f.a, f.base, f.A, f.B, f.pub
	pubMemory := chargeDone(t, base, memory.Name, pub.Token, "pub-f03-memory")
	aBefore, pubBefore := ledgerOf(t, a, A.Namespace), ledgerOf(t, a, pub.Namespace)
	inflight := make(chan sent, 1)
	go func() {
		r, err := labtest.SendCharge(base, memory.Name, A.Token, "a-f03-inflight", e2e.Body2500, slowFault(1500))
		inflight <- sent{r, err}
	}()
	e2e.WaitKeyState(t, base, A.Token, memory.Name, "a-f03-inflight", lab.KeyInFlight)
	for _, fault := range []lab.FaultPoint{lab.FaultCrashAfterClaim, lab.FaultCrashAfterCharge} {
		key := "b-crash-" + string(fault)
		if r, err := labtest.SendCharge(base, memory.Name, B.Token, key, e2e.Body2500, http.Header{lab.FaultHeader: {string(fault)}}); err == nil {
			t.Errorf("B's %s: answered %d %s, want a dropped connection", fault, r.Status, r.Body)
		}
	}
	// The crash is B's: B's memory map is gone…
	if st := e2e.KeyState(t, base, B.Token, memory.Name, "b-done-memory"); st != lab.KeyAbsent {
		t.Errorf("B's completed memory key after B's crash: %s, want absent", st)
	}
	if n := e2e.KeyCharges(t, a, B.Tenant, memory.Name, "b-crash-"+string(lab.FaultCrashAfterClaim)); n != 0 {
		t.Errorf("crash_after_claim charged %d times", n)
	}
	// …and A's and the public namespace's are whole, the charge in flight included.
	res := <-inflight
	if res.err != nil || res.reply.Status != http.StatusCreated {
		t.Fatalf("A's in-flight charge during B's crash: %v %d %s", res.err, res.reply.Status, res.reply.Body)
	}
	f.aDone[0].replays(t, base)
	pubMemory.replays(t, base)
	(doneCharge{memory.Name, A.Token, "a-f03-inflight", res.reply}).replays(t, base)
	if n := e2e.KeyCharges(t, a, A.Tenant, memory.Name, "a-done-memory"); n != 1 {
		t.Errorf("A's memory key holds %d charges, want 1", n)
	}
	sameLedger(t, "A", ledgerOf(t, a, A.Namespace), plus(aBefore, memory.Name, 1, 2500))
	sameLedger(t, "public", ledgerOf(t, a, pub.Namespace), pubBefore)
}

// attackSlowFlood (F04): B flooding the postgres store with slow charges
// never holds more than its namespace's budget of the pool across slow
// work (the rest refused 503 with Retry-After), while A's postgres
// charges are answered beside it; and B's slow attempts in flight are
// capped per namespace (the 65th a 429 with Retry-After that charges
// nothing) while A still charges.
func attackSlowFlood(t *testing.T, f *nsAttack) {
	a, base, A, B := f.a, f.base, f.A, f.B
	// B floods the postgres store with slow transactions on distinct keys.
	const n = 22
	budget := pgdb.BudgetFor(f.cfg.PGPoolSize).SlowPerNamespace // held across slow work
	results := flood(t, chargeRequests(t, base, postgres.Name, B.Token, "b-f04-pg", n, slowFault(holdWork)))
	labtest.Eventually(t, "B holding its postgres connections", func() bool { return claimingSessions(t, f.pool, f.cfg.PGSchema) >= budget })
	for i := range 3 {
		freshCharge(t, base, postgres.Name, A.Token, fmt.Sprintf("a-f04-pg-%d", i), e2e.Body2500)
	}
	select {
	case <-results:
		t.Fatal("B's flood was over before A's charges were answered: they did not run beside it")
	default:
	}
	applied := 0
	for i, s := range <-results {
		switch {
		case s.err != nil:
			t.Errorf("B's charge %d: %v", i, s.err)
		case s.reply.Status == http.StatusCreated:
			applied++
		default:
			if s.reply.Header.Get("Retry-After") == "" {
				t.Errorf("B's refused charge %d has no Retry-After", i)
			}
			labtest.WantProblem(t, fmt.Sprintf("B's charge %d beyond its budget", i), s.reply, http.StatusServiceUnavailable, "store_unavailable", "")
		}
	}
	charged := 0
	for i := range n {
		charged += e2e.KeyCharges(t, a, B.Tenant, postgres.Name, fmt.Sprintf("b-f04-pg-%d", i))
	}
	// How many of B's charges got through depends on when each arrived
	// (a slot freed by a finished one may still be in time for a later
	// one); what may never happen is B holding more than its budget.
	held := a.StorePools()[0].Held(B.Namespace)
	if applied < 1 || applied != charged || applied == n || held.PeakAcrossWork > budget {
		t.Errorf("B's flood: %d answered 201, %d charged, at most %d held across slow work at once; want some refused and at most %d held",
			applied, charged, held.PeakAcrossWork, budget)
	}
	for i := range 3 {
		if k := e2e.KeyCharges(t, a, A.Tenant, postgres.Name, fmt.Sprintf("a-f04-pg-%d", i)); k != 1 {
			t.Errorf("A's postgres charge %d: %d charges", i, k)
		}
	}

	// B's slow attempts in flight are capped per namespace: the 65th is a 429.
	results = flood(t, chargeRequests(t, base, memory.Name, B.Token, "b-f04-mem", 64, slowFault(holdWork)))
	labtest.Eventually(t, "B's 64 slow attempts in flight", func() bool {
		inFlight := 0
		for _, k := range stateAs(t, base, B.Token).Stores[memory.Name].Keys {
			if k.State == lab.KeyInFlight {
				inFlight++
			}
		}
		return inFlight == 64
	})
	r, err := labtest.SendCharge(base, memory.Name, B.Token, "b-f04-mem-64", e2e.Body2500, slowFault(holdWork))
	if err != nil {
		t.Fatal(err)
	}
	labtest.WantProblem(t, "B's 65th slow attempt", r, http.StatusTooManyRequests, "too_many_requests", "")
	if r.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	if r, err := labtest.SendCharge(base, memory.Name, A.Token, "a-f04-slow", e2e.Body2500, slowFault(50)); err != nil || r.Status != http.StatusCreated {
		t.Errorf("A's slow charge while B holds its share: %v %d %s", err, r.Status, r.Body)
	}
	freshCharge(t, base, postgres.Name, A.Token, "a-f04-pg-3", e2e.Body2500)
	for i, s := range <-results {
		if s.err != nil || s.reply.Status != http.StatusCreated {
			t.Errorf("B's slow memory charge %d: %v %d %s", i, s.err, s.reply.Status, s.reply.Body)
		}
	}
	if n := e2e.KeyCharges(t, a, B.Tenant, memory.Name, "b-f04-mem-64"); n != 0 {
		t.Errorf("the refused 65th attempt charged %d times", n)
	}
}

// attackReports (F05): the state, summary and outbox routes show each
// caller (A, B, anonymous, globex) its own namespace only — keys,
// balances, ledger, runs and outbox events, agreeing with the ledger —
// and the admin's bearer token every namespace, its key counts the sum of
// theirs.
func attackReports(t *testing.T, f *nsAttack) {
	a, base, A, B, pub := f.a, f.base, f.A, f.B, f.pub
	ctx := context.Background()
	type viewer struct {
		name, token string
		ns          lab.Namespace
		tenant      string
	}
	viewers := []viewer{
		{"A", A.Token, A.Namespace, A.Tenant}, {"B", B.Token, B.Namespace, B.Tenant},
		{"anonymous", "", pub.Namespace, pub.Tenant}, {"globex", labtest.Globex, "globex", "globex"},
	}
	sums := map[lab.StoreName]int{}
	for _, v := range viewers {
		st := stateAs(t, base, v.token)
		if st.Namespace != string(v.ns) {
			t.Errorf("%s's state is of namespace %q", v.name, st.Namespace)
		}
		for store, s := range st.Stores {
			sums[store] += s.Total
			for _, k := range s.Keys {
				if lab.NamespaceOf(k.Tenant) != v.ns {
					t.Errorf("%s sees %s's key %s (fingerprint %s) on %s", v.name, k.Tenant, k.Key, k.Fingerprint, store)
				}
			}
		}
		if len(st.BalanceCents) != 2 {
			t.Errorf("%s sees balances %v", v.name, st.BalanceCents)
		}
		for _, tenant := range []string{v.tenant, v.tenant + lab.SecondTenantSuffix} {
			want, err := a.Books().Balance(ctx, tenant, "acct-1")
			if got, ok := st.BalanceCents[tenant]; err != nil || !ok || got != want {
				t.Errorf("%s sees %s's balance %d (present %v), ledger %d", v.name, tenant, got, ok, want)
			}
		}
		sum := labtest.Get[nsSummary](t, base+"/diagnostics/summary", v.token)
		if sum.Namespace != string(v.ns) {
			t.Errorf("%s's summary is of namespace %q", v.name, sum.Namespace)
		}
		sameLedger(t, v.name+"'s summary", sum.Stores, ledgerOf(t, a, v.ns))
		for _, r := range sum.RecentRuns {
			if lab.NamespaceOf(r.Tenant) != v.ns {
				t.Errorf("%s sees %s's run %s", v.name, r.Tenant, r.RunID)
			}
		}
		if v.name != "globex" && len(sum.RecentRuns) == 0 {
			t.Errorf("%s sees none of its runs", v.name)
		}
		ob := labtest.Get[nsOutbox](t, base+"/outbox?limit=200", v.token)
		for _, e := range ob.Events {
			if lab.NamespaceOf(e.Tenant) != v.ns {
				t.Errorf("%s sees %s's outbox event %s", v.name, e.Tenant, e.ID)
			}
		}
		stats, err := a.Books().OutboxStats(ctx, v.ns)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := ob.Pending+ob.Delivered+ob.Dead, stats.Pending+stats.Delivered+stats.Dead; got != want {
			t.Errorf("%s's outbox counts %d events, its namespace holds %d", v.name, got, want)
		}
	}
	// The admin, as a bearer token, sees every namespace.
	all := stateAs(t, base, attackAdmin)
	seen := map[lab.Namespace]bool{}
	for store, s := range all.Stores {
		if s.Total != sums[store] {
			t.Errorf("admin counts %d keys on %s, the namespaces %d", s.Total, store, sums[store])
		}
		for _, k := range s.Keys {
			seen[lab.NamespaceOf(k.Tenant)] = true
		}
	}
	if all.Namespace != "" || !seen[A.Namespace] || !seen[B.Namespace] || !seen[pub.Namespace] {
		t.Errorf("admin's state (namespace %q) shows namespaces %v", all.Namespace, seen)
	}
	sum := labtest.Get[nsSummary](t, base+"/diagnostics/summary", attackAdmin)
	sameLedger(t, "admin's summary", sum.Stores, ledgerOf(t, a, ""))
	runsOf := map[lab.Namespace]bool{}
	for _, r := range sum.RecentRuns {
		runsOf[lab.NamespaceOf(r.Tenant)] = true
	}
	if sum.Namespace != "" || !runsOf[A.Namespace] || !runsOf[B.Namespace] || !runsOf[pub.Namespace] {
		t.Errorf("admin's summary (namespace %q) shows runs of %v", sum.Namespace, runsOf)
	}
}

// attackControlBytes (F06): control bytes, invalid UTF-8, broken escapes,
// empty and repeated values in the routes' parameters are each a 400
// naming the parameter, anonymous or as A, and change no ledger.
func attackControlBytes(t *testing.T, f *nsAttack) {
	a, base, A := f.a, f.base, f.A
	before := ledgerOf(t, a, "")
	for _, tc := range []struct {
		method, path, param string
	}{
		{http.MethodGet, "/idempotency/state?account=%00", "account"},
		{http.MethodGet, "/idempotency/state?account=%ff", "account"},
		{http.MethodGet, "/idempotency/state?store=postgres&key=%00", "key"},
		{http.MethodGet, "/idempotency/state?store=postgres&key=%ff", "key"},
		{http.MethodGet, "/idempotency/state?store=redis&key=a%0Ab", "key"},
		{http.MethodGet, "/idempotency/state?store=memory&key=a%7Fb", "key"},
		{http.MethodGet, "/idempotency/state?account=a%C2%85b", "account"},
		{http.MethodGet, "/idempotency/state?account=", "account"},
		{http.MethodGet, "/idempotency/state?account=a&account=b", "account"},
		{http.MethodGet, "/idempotency/state?store=%00", "store"},
		{http.MethodGet, "/idempotency/state?limit=%ff", "limit"},
		{http.MethodGet, "/idempotency/state?account=%zz", "query"},
		{http.MethodGet, "/idempotency/state?account=%f", "query"},
		{http.MethodGet, "/outbox?limit=%00", "limit"},
		{http.MethodGet, "/charge-idempotent?store=postgres&key=%00", "key"},
		{http.MethodGet, "/charge-idempotent?store=postgres&account=%ff", "account"},
		{http.MethodGet, "/charge-idempotent?store=postgres&order_id=%00", "order_id"},
		{http.MethodGet, "/charge-unsafe?key=%ff%fe", "key"},
		{http.MethodPost, "/lab/restart-store?store=%00", "store"},
		{http.MethodPost, "/reset-lab?all=%00", "all"},
		{http.MethodGet, "/lab/matrix?format=%ff", "format"},
	} {
		for _, token := range []string{"", A.Token} {
			r := labtest.Do(t, tc.method, base+tc.path, labtest.Bearer(token), "")
			labtest.WantProblem(t, tc.method+" "+tc.path, r, http.StatusBadRequest, "invalid_parameter", tc.param)
		}
	}
	sameLedger(t, "every namespace", ledgerOf(t, a, ""), before)
	for _, d := range f.aDone {
		d.replays(t, base)
	}
}

// attackMalformedBodies (F07): every malformed body (the review's shapes
// and their neighbours, at least 44) is a 400 naming its parameter on
// every store, charges nothing and leaves no key.
func attackMalformedBodies(t *testing.T, f *nsAttack) {
	a, base, A := f.a, f.base, f.A
	aBefore, stateBefore := ledgerOf(t, a, A.Namespace), stateAs(t, base, A.Token)
	bodies := malformedBodies()
	if len(bodies) < 44 {
		t.Fatalf("only %d malformed bodies", len(bodies))
	}
	stores := append([]lab.StoreName{unsafestore.Name}, keyedStores...)
	for i, b := range bodies {
		key := fmt.Sprintf("a-f07-%d", i)
		for _, store := range stores {
			r, err := labtest.SendCharge(base, store, A.Token, key, b.body, nil)
			if err != nil {
				t.Fatalf("%s on %s: %v", b.name, store, err)
			}
			labtest.WantProblem(t, fmt.Sprintf("%s (%q) on %s", b.name, b.body, store), r, http.StatusBadRequest, "invalid_parameter", b.param)
		}
	}
	sameLedger(t, "A after the malformed bodies", ledgerOf(t, a, A.Namespace), aBefore)
	for i := range bodies {
		key := fmt.Sprintf("a-f07-%d", i)
		for _, store := range stores {
			if n := e2e.KeyCharges(t, a, A.Tenant, store, key); n != 0 {
				t.Errorf("%s on %s charged %d times", bodies[i].name, store, n)
			}
		}
		for _, store := range keyedStores {
			if st := e2e.KeyState(t, base, A.Token, store, key); st != lab.KeyAbsent {
				t.Errorf("%s left key %s %s on %s", bodies[i].name, key, st, store)
			}
		}
	}
	after := stateAs(t, base, A.Token)
	for store, s := range stateBefore.Stores {
		if after.Stores[store].Total != s.Total {
			t.Errorf("A's keys on %s: %d before, %d after", store, s.Total, after.Stores[store].Total)
		}
	}
}

// attackAdminToken (F08): the admin token counts only as a bearer token:
// in another header, a cookie or the URL (refused, naming it) it neither
// resets nor restarts every namespace nor shows a report; as a bearer it
// charges nobody and sees everything; no ledger moves and the attendees'
// keys still replay.
func attackAdminToken(t *testing.T, f *nsAttack) {
	a, base := f.a, f.base
	before := ledgerOf(t, a, "")
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+attackAdmin))
	headers := []http.Header{
		{"Authorization": {attackAdmin}}, {"Authorization": {"Token " + attackAdmin}}, {"Authorization": {basic}},
		{"Authorization": {"Bearer  " + attackAdmin}}, {"Authorization": {"Bearer " + attackAdmin + "x"}},
		{"X-Admin-Token": {attackAdmin}}, {"Cookie": {"token=" + attackAdmin}},
	}
	queries := []string{"token=" + attackAdmin, "admin_token=" + attackAdmin, "access_token=" + attackAdmin}
	try := func(method, route string) {
		for _, h := range headers {
			r := labtest.Do(t, method, base+route, h, "")
			if r.Status != http.StatusUnauthorized {
				t.Errorf("%s %s with %v: %d %s", method, route, h, r.Status, r.Body)
			}
		}
		for _, q := range queries { // a token in the URL is refused, naming it
			r := labtest.Do(t, method, base+route+"&"+q, nil, "")
			if name, _, _ := strings.Cut(q, "="); r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), `"param":"`+name+`"`) {
				t.Errorf("%s %s&%s: %d %s", method, route, q, r.Status, r.Body)
			}
		}
	}
	try(http.MethodPost, "/reset-lab?all=true")
	try(http.MethodPost, "/lab/restart-store?store=memory&all=true")
	try(http.MethodPost, "/lab/restart-store?store=redis&all=true")
	// Reports: a token in the URL is refused, never read; a bad header is refused.
	for _, q := range queries {
		for _, route := range []string{"/idempotency/state?limit=200&" + q, "/diagnostics/summary?" + q} {
			if r := labtest.Do(t, http.MethodGet, base+route, nil, ""); r.Status != http.StatusBadRequest || strings.Contains(string(r.Body), `"namespace"`) {
				t.Errorf("%s: %d %s, want 400 and no report", route, r.Status, r.Body)
			}
		}
	}
	for _, h := range headers[:5] {
		if r := labtest.Do(t, http.MethodGet, base+"/diagnostics/summary", h, ""); r.Status != http.StatusUnauthorized {
			t.Errorf("summary with %v: %d", h, r.Status)
		}
	}
	// The admin charges nobody.
	labtest.WantProblem(t, "a charge with the admin token", func() labtest.Reply {
		r, err := labtest.SendCharge(base, memory.Name, attackAdmin, "admin-charge", e2e.Body2500, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}(), http.StatusUnauthorized, "unauthorized", "")
	// As a bearer token, the admin sees everything.
	if sum := labtest.Get[nsSummary](t, base+"/diagnostics/summary", attackAdmin); sum.Namespace != "" {
		t.Errorf("admin's summary is of namespace %q", sum.Namespace)
	}
	sameLedger(t, "every namespace", ledgerOf(t, a, ""), before)
	for _, d := range slices.Concat(f.aDone, f.bDone) {
		d.replays(t, base)
	}
}

// attackClosingProperty: the worst B can do in its own namespace —
// crashes and restarts on every store, a slow flood, the matrix, more runs
// than the history keeps, a reset — leaves A's ledger, balances, recent
// runs, keys and replays as they were, each of A's postgres charges meanwhile
// charged once; B's attempts on every namespace at once are refused.
func attackClosingProperty(t *testing.T, f *nsAttack) {
	a, base, A, B := f.a, f.base, f.A, f.B
	snap := snapshotOf(t, a, A)
	if len(snap.runs) == 0 {
		t.Fatal("A has no runs to keep")
	}
	check := func(t *testing.T, after string, extra int) {
		t.Helper()
		got := snapshotOf(t, a, A)
		sameLedger(t, "A after "+after, got.ledger, plus(snap.ledger, postgres.Name, extra, 2500))
		if !maps.Equal(got.balance, snap.balance) {
			t.Errorf("A's balances after %s: %v, were %v", after, got.balance, snap.balance)
		}
		if !slices.Equal(got.runs, snap.runs) {
			t.Errorf("A's recent runs after %s: %d %v, were %d %v", after, len(got.runs), got.runs, len(snap.runs), snap.runs)
		}
		for store, n := range snap.keys {
			if store == postgres.Name {
				n += extra
			}
			if got.keys[store] != n {
				t.Errorf("A's keys on %s after %s: %d, were %d", store, after, got.keys[store], n)
			}
		}
		for _, d := range f.aDone {
			d.replays(t, base)
		}
	}
	aCharges := 0 // A's postgres charges of acct-2 (its balance is of acct-1)
	aCharge := func() {
		freshCharge(t, base, postgres.Name, A.Token, fmt.Sprintf("a-close-%d", aCharges), `{"account":"acct-2","amount_cents":2500}`)
		aCharges++
	}

	// B crashes on every store, at both crash points.
	for _, store := range keyedStores {
		for _, fault := range []lab.FaultPoint{lab.FaultCrashAfterClaim, lab.FaultCrashAfterCharge} {
			if r, err := labtest.SendCharge(base, store, B.Token, "b-close-"+string(store)+"-"+string(fault), e2e.Body2500,
				http.Header{lab.FaultHeader: {string(fault)}}); err == nil {
				t.Errorf("B's %s on %s answered %d %s, want a dropped connection", fault, store, r.Status, r.Body)
			}
		}
	}
	// B restarts every store, by route and by run; every namespace at once is refused.
	for _, store := range keyedStores {
		r := labtest.Do(t, http.MethodPost, base+"/lab/restart-store?store="+string(store), labtest.Bearer(B.Token), "")
		if got := labtest.Decode[scopeReply](t, r); r.Status != http.StatusOK || got.Namespace != string(B.Namespace) {
			t.Errorf("B's restart of %s: %d %s", store, r.Status, r.Body)
		}
		labtest.WantProblem(t, "B's restart of every namespace", labtest.Do(t, http.MethodPost,
			base+"/lab/restart-store?all=true&store="+string(store), labtest.Bearer(B.Token), ""), http.StatusUnauthorized, "admin_token_required", "")
		r = labtest.Do(t, http.MethodGet, base+"/charge-idempotent?fault=store_restart&attempts=3&store="+string(store)+"&key=b-close-restart", labtest.Bearer(B.Token), "")
		if rep := labtest.Decode[experiment.Report](t, r); r.Status != http.StatusOK || rep.Tenant != B.Tenant {
			t.Errorf("B's store_restart run on %s: %d %.300s", store, r.Status, r.Body)
		}
	}
	check(t, "B's crashes and restarts", aCharges)

	// B floods the postgres store with slow charges; A keeps charging meanwhile.
	results := flood(t, chargeRequests(t, base, postgres.Name, B.Token, "b-close-slow", 22, slowFault(holdWork)))
	labtest.Eventually(t, "B holding its postgres connections", func() bool { return claimingSessions(t, f.pool, f.cfg.PGSchema) >= 2 })
	for range 3 {
		aCharge()
	}
	for i, s := range <-results {
		if s.err != nil || s.reply.Status >= 500 && s.reply.Header.Get("Retry-After") == "" {
			t.Errorf("B's slow charge %d: %v %d", i, s.err, s.reply.Status)
		}
	}
	check(t, "B's slow flood", aCharges)

	// B runs the matrix in its namespace.
	r := labtest.Do(t, http.MethodGet, base+"/lab/matrix", labtest.Bearer(B.Token), "")
	if m := labtest.Decode[experiment.Matrix](t, r); r.Status != http.StatusOK || len(m.Rows) == 0 {
		t.Fatalf("B's matrix: %d %.300s", r.Status, r.Body)
	}
	check(t, "B's matrix", aCharges)

	// B fires more runs than the lab keeps in its history.
	for i := range 101 {
		r := labtest.Do(t, http.MethodGet, fmt.Sprintf("%s/charge-unsafe?attempts=1&key=b-close-run-%d", base, i), labtest.Bearer(B.Token), "")
		if r.Status != http.StatusOK {
			t.Fatalf("B's run %d: %d %s", i, r.Status, r.Body)
		}
	}
	check(t, "B's 101 runs", aCharges)

	// B resets its namespace; every namespace at once is refused.
	labtest.WantProblem(t, "B's reset of every namespace", labtest.Do(t, http.MethodPost, base+"/reset-lab?all=true", labtest.Bearer(B.Token), ""),
		http.StatusUnauthorized, "admin_token_required", "")
	r = labtest.Do(t, http.MethodPost, base+"/reset-lab", labtest.Bearer(B.Token), "")
	if got := labtest.Decode[scopeReply](t, r); r.Status != http.StatusOK || !got.Reset || got.Namespace != string(B.Namespace) {
		t.Fatalf("B's reset: %d %s", r.Status, r.Body)
	}
	check(t, "B's reset", aCharges)
	if l := ledgerOf(t, a, B.Namespace); len(l) != 0 {
		t.Errorf("B's ledger after its reset: %+v", l)
	}
	for store, s := range stateAs(t, base, B.Token).Stores {
		if s.Total != 0 {
			t.Errorf("B's keys on %s after its reset: %d", store, s.Total)
		}
	}

	// A's postgres charges keep succeeding, each charged once.
	for range 3 {
		aCharge()
	}
	for i := range aCharges {
		if n := e2e.KeyCharges(t, a, A.Tenant, postgres.Name, fmt.Sprintf("a-close-%d", i)); n != 1 {
			t.Errorf("A's charge a-close-%d: %d charges", i, n)
		}
	}
	check(t, "everything B did", aCharges)
}

// malformedBody is a body that must be refused, and the parameter the
// refusal names.
type malformedBody struct {
	name, body, param string
}

// malformedBodies are the shapes the review found charged: trailing data,
// amounts that are not JSON integers, duplicate keys, invalid UTF-8, null
// values, and their neighbours.
func malformedBodies() []malformedBody {
	const ok = `{"account":"acct-1","amount_cents":2500,"currency":"USD"}`
	withAmount := func(v string) string { return `{"account":"acct-1","amount_cents":` + v + `}` }
	var out []malformedBody
	for _, trail := range []string{"]", "}", "]]", "}}", " x", "null", "0", "{}", ",", `"`, ok, "\x00"} {
		out = append(out, malformedBody{"Trailing" + fmt.Sprintf("%q", trail), ok + trail, "body"})
	}
	for _, v := range []string{`"2500"`, `"abc"`, `2500.0`, `2.5e3`, `2500e0`, `25e2`, `-0`, `1e1000`, `true`, `[2500]`, `{"v":2500}`,
		`null`, `99999999999999999999`, `-5`, `0`, `10000001`} {
		out = append(out, malformedBody{"Amount" + v, withAmount(v), "amount_cents"})
	}
	for _, v := range []string{`02500`, `+2500`, `.5`, `0x9c4`, `2_500`} { // not JSON at all
		out = append(out, malformedBody{"AmountSyntax" + v, withAmount(v), "body"})
	}
	for _, tc := range []struct{ body, param string }{
		{`{"amount_cents":-5,"amount_cents":2500,"account":"acct-1"}`, "amount_cents"},
		{`{"account":"acct-1","amount_cents":2500,"amount_cents":2500}`, "amount_cents"},
		{`{"account":"victim","account":"acct-1","amount_cents":2500}`, "account"},
		{`{"account":"acct-1","amount_cents":2500,"currency":"EUR","currency":"USD"}`, "currency"},
		{`{"account":"acct-1","amount_cents":2500,"order_id":"o-1","order_id":"o-2"}`, "order_id"},
		{`{"account":"acct-1","amount_cents":1,"amount\u005fcents":2500}`, "amount_cents"},
	} {
		out = append(out, malformedBody{"Duplicate", tc.body, tc.param})
	}
	for _, bad := range []string{"\xff", "\xc3\x28", "\xc0\xaf", "\xed\xa0\x80", "\xe2\x82", "\xf4\x90\x80\x80"} {
		out = append(out, malformedBody{"InvalidUTF8", `{"account":"acct-` + bad + `","amount_cents":2500}`, "body"})
	}
	out = append(out,
		malformedBody{"InvalidUTF8InName", `{"account":"acct-1","amount_cents":2500,"` + "\xff" + `":1}`, "body"},
		malformedBody{"LoneSurrogate", `{"account":"acct-\ud800","amount_cents":2500}`, "body"},
		malformedBody{"ByteOrderMark", "\xef\xbb\xbf" + ok, "body"},
	)
	out = append(out,
		malformedBody{"NullOrderID", `{"account":"acct-1","amount_cents":2500,"order_id":null}`, "order_id"},
		malformedBody{"NullCurrency", `{"account":"acct-1","amount_cents":2500,"currency":null}`, "currency"},
		malformedBody{"NullAccount", `{"account":null,"amount_cents":2500}`, "account"},
		malformedBody{"EmptyOrderID", `{"account":"acct-1","amount_cents":2500,"order_id":""}`, "order_id"},
		malformedBody{"EmptyCurrency", `{"account":"acct-1","amount_cents":2500,"currency":""}`, "currency"},
	)
	for _, b := range []string{`[` + ok + `]`, `"` + ok + `"`, `2500`, `null`, ``, ` `, `{`} {
		out = append(out, malformedBody{"NotAnObject", b, "body"})
	}
	return out
}

// attackSlowClients (finding 9): a flood of clients that trickle their
// headers or bodies, or sit idle on kept-alive connections, is closed by the
// timeouts while normal requests keep working; a request with both
// Content-Length and Transfer-Encoding is answered at once. The single
// connection shapes are TestTimeoutsCloseSlowClients and
// TestBodiesMustSayTheirLength; this is the attack's scale.
func attackSlowClients(t *testing.T) {
	a := labtest.Start(t, e2e.Config(func(c *app.Config) {
		c.ReadTimeout, c.IdleTimeout = 400*time.Millisecond, 400*time.Millisecond
		c.AdminToken, c.JoinCode = attackAdmin, attackJoinCode
	}))
	base := a.URL()
	addr := strings.TrimPrefix(base, "http://")
	A := joinLab(t, base, attackJoinCode)
	slowBody := "POST /charges?store=memory HTTP/1.1\r\nHost: lab\r\nAuthorization: Bearer " + A.Token +
		"\r\nIdempotency-Key: a-slow-body\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{"
	shapes := []struct{ name, head, drip string }{
		{"slowloris", "POST /charges HTTP/1.1\r\nHost: lab\r\nX-Slow: ", "a"},
		{"slow body", slowBody, " "},
		{"idle keep-alive", "GET /health HTTP/1.1\r\nHost: lab\r\n\r\n", ""},
	}
	type open struct {
		name   string
		closed <-chan bool
	}
	var conns []open
	for _, s := range shapes {
		for range 16 {
			conns = append(conns, open{s.name, labtest.SlowClient(t, addr, s.head, s.drip, 5*time.Second)})
		}
	}
	// Normal requests work while the slow clients hold their connections.
	freshCharge(t, base, memory.Name, A.Token, "a-normal", e2e.Body2500)
	if r := labtest.Do(t, http.MethodGet, base+"/health", nil, ""); r.Status != http.StatusOK {
		t.Errorf("health during the slow clients: %d", r.Status)
	}
	for _, c := range conns {
		if !<-c.closed {
			t.Errorf("a %s client was never closed", c.name)
		}
	}
	// Content-Length and Transfer-Encoding together: a 411 at once, no hang.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	chunk := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(e2e.Body2500), e2e.Body2500)
	_, _ = io.WriteString(conn, "POST /charges?store=memory HTTP/1.1\r\nHost: lab\r\nAuthorization: Bearer "+A.Token+
		"\r\nIdempotency-Key: a-te\r\nContent-Length: 57\r\nTransfer-Encoding: chunked\r\n\r\n"+chunk)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("Content-Length with Transfer-Encoding: no answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusLengthRequired || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("Content-Length with Transfer-Encoding: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, key := range []string{"a-slow-body", "a-te"} {
		if n := e2e.KeyCharges(t, a, A.Tenant, memory.Name, key); n != 0 {
			t.Errorf("%s charged %d times", key, n)
		}
	}
	if n := e2e.KeyCharges(t, a, A.Tenant, memory.Name, "a-normal"); n != 1 {
		t.Errorf("the normal charge: %d charges", n)
	}
}

// attackManyKeys (finding 10): with 20,000 memory keys in B's namespace,
// A's /idempotency/state answers A's keys and A's charges succeed, while
// the admin lists every namespace over and over. No timing is asserted.
func attackManyKeys(t *testing.T) {
	a := labtest.Start(t, e2e.Config(func(c *app.Config) { c.AdminToken, c.JoinCode = attackAdmin, attackJoinCode }))
	base := a.URL()
	A, B := joinLab(t, base, attackJoinCode), joinLab(t, base, attackJoinCode)
	const conns, per = 8, 500
	pipelineCharges(t, strings.TrimPrefix(base, "http://"), B.Token, conns, per)
	if sum := ledgerOf(t, a, B.Namespace); len(sum) != 1 || sum[0].ChargesApplied != conns*per {
		t.Fatalf("B's ledger: %+v", sum)
	}
	stop := make(chan struct{})
	var lister sync.WaitGroup
	lister.Go(func() { // the admin's view walks every key, again and again
		for {
			select {
			case <-stop:
				return
			default:
			}
			if r, err := labtest.Send(http.MethodGet, base+"/idempotency/state?store=memory&limit=200", labtest.Bearer(attackAdmin), ""); err != nil || r.Status != http.StatusOK {
				t.Errorf("admin's state: %v %d", err, r.Status)
				return
			}
		}
	})
	for i := range 5 {
		freshCharge(t, base, memory.Name, A.Token, fmt.Sprintf("a-f10-%d", i), e2e.Body2500)
		st := labtest.Get[nsState](t, base+"/idempotency/state?store=memory&limit=200", A.Token)
		mem := st.Stores[memory.Name]
		if mem.Total != i+1 || len(mem.Keys) != i+1 || mem.Keys[0].Key != fmt.Sprintf("a-f10-%d", i) || mem.Keys[0].Tenant != A.Tenant {
			t.Errorf("A's state after %d charges: total %d, keys %+v", i+1, mem.Total, mem.Keys)
		}
	}
	close(stop)
	lister.Wait()
	if st := labtest.Get[nsState](t, base+"/idempotency/state?store=memory&limit=1", B.Token); st.Stores[memory.Name].Total != conns*per {
		t.Errorf("B's state counts %d keys", st.Stores[memory.Name].Total)
	}
	if st := labtest.Get[nsState](t, base+"/idempotency/state?store=memory&limit=200", attackAdmin); st.Stores[memory.Name].Total != conns*per+5 ||
		len(st.Stores[memory.Name].Keys) != 200 {
		t.Errorf("admin's state counts %d keys, lists %d", st.Stores[memory.Name].Total, len(st.Stores[memory.Name].Keys))
	}
	for i := range 5 {
		if n := e2e.KeyCharges(t, a, A.Tenant, memory.Name, fmt.Sprintf("a-f10-%d", i)); n != 1 {
			t.Errorf("A's charge %d: %d charges", i, n)
		}
	}
}

// pipelineCharges sends conns×per memory charges as token, each
// connection's requests pipelined (HTTP/1.1), and checks every answer.
func pipelineCharges(t *testing.T, addr, token string, conns, per int) {
	t.Helper()
	var wg sync.WaitGroup
	for c := range conns {
		wg.Go(func() {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			var buf bytes.Buffer
			for i := range per {
				fmt.Fprintf(&buf, "POST /charges?store=memory HTTP/1.1\r\nHost: lab\r\nAuthorization: Bearer %s\r\nIdempotency-Key: bulk-%d-%d\r\n"+
					"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", token, c, i, len(e2e.Body2500), e2e.Body2500)
			}
			written := make(chan error, 1)
			go func() {
				_, err := conn.Write(buf.Bytes())
				written <- err
			}()
			br := bufio.NewReader(conn)
			for i := range per {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Errorf("connection %d, answer %d: %v", c, i, err)
					conn.Close()
					break
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					t.Errorf("connection %d, charge %d: %d", c, i, resp.StatusCode)
				}
			}
			if err := <-written; err != nil {
				t.Errorf("connection %d: %v", c, err)
			}
		})
	}
	wg.Wait()
}

// attackLostConnections (finding 11): runs whose PostgreSQL sessions are
// terminated around them answer 200, or 503 with Retry-After, never a bare
// 500. The admin's restart of every namespace, issued between and beside
// runs, shows the route the review used; terminating the lab's sessions
// from outside, with no pool reset after it, makes the run's first ledger
// read meet a dead connection every time.
func attackLostConnections(t *testing.T) {
	cfg := e2e.FullConfig(t)
	cfg.AdminToken, cfg.JoinCode, cfg.PGPoolSize = attackAdmin, attackJoinCode, 8
	a := labtest.Start(t, cfg)
	base := a.URL()
	pool := e2e.Pool(t, cfg.DatabaseURL)
	ctx := context.Background()
	A := joinLab(t, base, attackJoinCode)
	notBare500 := func(what string, r labtest.Reply) {
		t.Helper()
		switch {
		case r.Status == http.StatusServiceUnavailable:
			if r.Header.Get("Retry-After") == "" || r.Header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s: 503 without Retry-After or problem+json: %s", what, r.Body)
			}
		case r.Status != http.StatusOK:
			t.Errorf("%s: %d %.300s", what, r.Status, r.Body)
		}
	}
	restartAll := func() labtest.Reply {
		return labtest.Do(t, http.MethodPost, base+"/lab/restart-store?store=postgres&all=true", labtest.Bearer(attackAdmin), "")
	}

	// The admin's restart between runs, and beside slow runs.
	for i, store := range []lab.StoreName{postgres.Name, memory.Name, redis.Name, unsafestore.Name, postgres.Name} {
		notBare500("admin restart", restartAll())
		run := labtest.Do(t, http.MethodGet, fmt.Sprintf("%s/charge-idempotent?store=%s&attempts=3&key=f11-after-%d", base, store, i), labtest.Bearer(A.Token), "")
		if store == unsafestore.Name {
			run = labtest.Do(t, http.MethodGet, fmt.Sprintf("%s/charge-unsafe?attempts=3&key=f11-after-%d", base, i), nil, "")
		}
		notBare500("run right after the restart", run)
	}
	beside := make(chan sent, 2)
	for _, store := range []lab.StoreName{postgres.Name, memory.Name} {
		go func() {
			r, err := labtest.Send(http.MethodGet, base+"/charge-idempotent?fault=slow&work_ms=400&attempts=4&store="+string(store)+
				"&key=f11-beside-"+string(store), nil, "")
			beside <- sent{r, err}
		}()
	}
	for range 5 {
		notBare500("admin restart beside runs", restartAll())
	}
	for range 2 {
		s := <-beside
		if s.err != nil {
			t.Fatalf("run beside the restarts: %v", s.err)
		}
		notBare500("run beside the restarts", s.reply)
	}

	// The lab's sessions terminated from outside, as a failover would.
	app := labApplicationName(t, base, A.Token, pool, cfg.PGSchema)
	for i := range 3 {
		var warm sync.WaitGroup
		for range 6 { // several idle ledger connections, used just now (no liveness ping)
			warm.Go(func() { labtest.Do(t, http.MethodGet, base+"/diagnostics/summary", nil, "") })
		}
		warm.Wait()
		var pids []int32
		if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&pids); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid`, pids); err != nil {
			t.Fatal(err)
		}
		labtest.Eventually(t, "the lab's sessions ending", func() bool {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 0
		})
		store := keyedStores[i]
		r := labtest.Do(t, http.MethodGet, fmt.Sprintf("%s/charge-idempotent?store=%s&attempts=3&key=f11-killed-%d", base, store, i), nil, "")
		notBare500(fmt.Sprintf("run on %s after %d sessions were terminated", store, len(pids)), r)
	}
	// And the lab still charges, once: a client retries a 503 with the same
	// key, as Retry-After tells it to, while the pools shed dead connections.
	var last labtest.Reply
	for range 10 {
		r, err := labtest.SendCharge(base, postgres.Name, A.Token, "a-f11-last", e2e.Body2500, nil)
		if err != nil {
			t.Fatal(err)
		}
		if last = r; r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
			break
		}
	}
	if last.Status != http.StatusCreated {
		t.Errorf("the last charge: %d %s", last.Status, last.Body)
	}
	if n := e2e.KeyCharges(t, a, A.Tenant, postgres.Name, "a-f11-last"); n != 1 {
		t.Errorf("the last charge: %d charges", n)
	}
}

// labApplicationName finds the application_name of the lab's sessions: the
// one holding a claim on the lab's idempotency_requests table while a slow
// postgres charge is in flight (each test has its own schema).
func labApplicationName(t *testing.T, base, token string, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	done := make(chan sent, 1)
	go func() {
		r, err := labtest.SendCharge(base, postgres.Name, token, "find-sessions", e2e.Body2500, slowFault(800))
		done <- sent{r, err}
	}()
	var name string
	labtest.Eventually(t, "a claim in the lab's schema", func() bool {
		err := pool.QueryRow(context.Background(), `SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.relation = to_regclass($1) AND l.granted LIMIT 1`, schema+".idempotency_requests").Scan(&name)
		return err == nil && name != ""
	})
	if res := <-done; res.err != nil || res.reply.Status != http.StatusCreated {
		t.Fatalf("slow charge: %v %d", res.err, res.reply.Status)
	}
	return name
}
