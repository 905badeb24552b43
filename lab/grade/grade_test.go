package grade_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/grade"
)

// flaws are the mistakes a target can be built with, one per lesson.
type flaws struct {
	lookFirst        bool          // looks the key up, then charges: check, then act
	bytesFingerprint bool          // hashes the body's bytes, not its fields
	sharedKeys       bool          // keys not scoped per client
	retention        time.Duration // keys forgotten after this (0: never)
}

// entry is one key of the target.
type entry struct {
	fp     string
	done   chan struct{}
	status int
	body   []byte
	at     time.Time
}

// target is a small Idempotency-Key API: POST /charges makes a charge,
// GET /charges?key= lists the charges made under a key.
type target struct {
	flaws
	mu      sync.Mutex
	keys    map[string]*entry
	charges map[string][]string
	next    int
}

func newTarget(t *testing.T, f flaws) *httptest.Server {
	t.Helper()
	tg := &target{flaws: f, keys: map[string]*entry{}, charges: map[string][]string{}}
	srv := httptest.NewServer(tg)
	t.Cleanup(srv.Close)
	return srv
}

func problem(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"title":%q,"status":%d,"code":%q}`+"\n", code, status, code)
}

func (tg *target) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		problem(w, http.StatusUnauthorized, "unauthorized")
		return
	}
	if tg.sharedKeys {
		tenant = "everyone"
	}
	if r.Method == http.MethodGet {
		tg.mu.Lock()
		ids := append([]string{}, tg.charges[tenant+"|"+r.URL.Query().Get("key")]...)
		tg.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(ids)
		return
	}
	lines := r.Header.Values("Idempotency-Key")
	switch {
	case len(lines) == 0:
		problem(w, http.StatusBadRequest, "idempotency_key_missing")
		return
	case len(lines) > 1:
		problem(w, http.StatusBadRequest, "invalid_parameter")
		return
	}
	key := tenant + "|" + strings.Trim(lines[0], `"`)
	body, _ := io.ReadAll(r.Body)
	var fields map[string]any
	if json.Unmarshal(body, &fields) != nil {
		problem(w, http.StatusBadRequest, "invalid_parameter")
		return
	}
	fp := string(body)
	if !tg.bytesFingerprint {
		canon, _ := json.Marshal(fields)
		fp = string(canon)
	}
	work, _ := strconv.Atoi(r.Header.Get("Work-Ms"))
	if tg.lookFirst {
		tg.mu.Lock()
		e := tg.keys[key]
		tg.mu.Unlock()
		if e != nil {
			tg.answer(w, e, fp)
			return
		}
		tg.work(20*time.Millisecond + time.Duration(work)*time.Millisecond) // the window between the look and the write
		e = &entry{fp: fp, done: make(chan struct{}), at: time.Now()}
		tg.mu.Lock()
		tg.charge(key, e)
		tg.keys[key] = e
		tg.mu.Unlock()
		close(e.done)
		tg.write(w, e, false)
		return
	}
	tg.mu.Lock()
	e := tg.keys[key]
	if e != nil && tg.retention > 0 && time.Since(e.at) > tg.retention {
		e = nil // expired: the key is new
	}
	if e != nil {
		tg.mu.Unlock()
		tg.answer(w, e, fp)
		return
	}
	e = &entry{fp: fp, done: make(chan struct{}), at: time.Now()}
	tg.keys[key] = e
	tg.mu.Unlock()
	tg.work(time.Duration(work) * time.Millisecond)
	tg.mu.Lock()
	tg.charge(key, e)
	tg.mu.Unlock()
	close(e.done)
	tg.write(w, e, false)
}

// work is the target's work on a charge: the time it takes is the point
// (the window in which retries overlap), so it is slept, not waited on.
func (tg *target) work(d time.Duration) { time.Sleep(d) }

// charge applies one charge for key and stores its answer in e; tg.mu held.
func (tg *target) charge(key string, e *entry) {
	tg.next++
	id := fmt.Sprintf("ch_%d", tg.next)
	tg.charges[key] = append(tg.charges[key], id)
	e.status, e.body = http.StatusCreated, fmt.Appendf(nil, `{"id":%q,"amount_cents":1234}`+"\n", id)
}

// answer is a retry's: another payload refused, in flight waited for
// (then 409), completed replayed.
func (tg *target) answer(w http.ResponseWriter, e *entry, fp string) {
	if e.fp != fp {
		problem(w, http.StatusUnprocessableEntity, "idempotency_key_reused")
		return
	}
	select {
	case <-e.done:
		tg.write(w, e, true)
	case <-time.After(2 * time.Second):
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusConflict, "idempotency_in_progress")
	}
}

func (tg *target) write(w http.ResponseWriter, e *entry, replay bool) {
	w.Header().Set("Content-Type", "application/json")
	if replay {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(e.status)
	w.Write(e.body)
}

func check(t *testing.T, srv *httptest.Server, mod func(*grade.Config)) grade.Report {
	t.Helper()
	c := grade.Config{Target: srv.URL + "/charges?v=1", Token: "t1", Token2: "t2", ReplayHeader: "Idempotent-Replayed",
		ReadBack: srv.URL + "/charges?key={key}", SlowHeader: http.Header{"Work-Ms": {"200"}}, Storm: 12, Timeout: time.Minute}
	if mod != nil {
		mod(&c)
	}
	rep, err := grade.Run(context.Background(), c)
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	return rep
}

func verdicts(rep grade.Report) map[string]grade.Result {
	out := map[string]grade.Result{}
	for _, r := range rep.Results {
		out[r.ID] = r
	}
	return out
}

func TestASoundTargetPassesEveryCase(t *testing.T) {
	t.Parallel()
	rep := check(t, newTarget(t, flaws{}), nil)
	for _, r := range rep.Results {
		want := grade.Pass
		if r.ID == "retention" {
			want = grade.NotApplicable // none declared
		}
		if r.Verdict != want {
			t.Errorf("%s: %s (%s); want %s", r.ID, r.Verdict, r.Why, want)
		}
	}
	if !rep.Passed() || rep.Requests > grade.DefaultRequests {
		t.Errorf("passed %v with %d requests; want passed within the budget", rep.Passed(), rep.Requests)
	}
	if len(rep.Results) != len(grade.Cases()) {
		t.Errorf("%d results for %d cases", len(rep.Results), len(grade.Cases()))
	}
	// The table says what its own words mean, and the summary what passed.
	var table strings.Builder
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, word := range []string{"draft-07: ", "MUST, SHOULD: ", "sf-string: ", "storm: ", "PASSED: no MUST case (a rule the draft says MUST)"} {
		if !strings.Contains(table.String(), word) {
			t.Errorf("the table does not explain %q:\n%s", word, table.String())
		}
	}
}

func TestCheckThenActFailsTheStormAndTheHistory(t *testing.T) {
	t.Parallel()
	rep := check(t, newTarget(t, flaws{lookFirst: true}), nil)
	v := verdicts(rep)
	for _, id := range []string{"storm", "in-flight", "history"} {
		if v[id].Verdict != grade.Fail {
			t.Errorf("%s: %s (%s); want fail", id, v[id].Verdict, v[id].Why)
		}
	}
	// How many of the 12 land inside the look-to-write window is the
	// scheduler's to decide; that more than one made its own is the flaw.
	var made int
	if _, err := fmt.Sscanf(v["storm"].Why, "12 concurrent retries made %d resources", &made); err != nil || made < 2 {
		t.Errorf("storm: %q; want the 12 retries to have made more than one resource", v["storm"].Why)
	}
	if rep.Passed() || !slices.Contains(rep.Failed, "storm") {
		t.Errorf("failed %v; want the storm named", rep.Failed)
	}
}

func TestAStormWithoutReadBackStillSeesTwoIDs(t *testing.T) {
	t.Parallel()
	rep := check(t, newTarget(t, flaws{lookFirst: true}), func(c *grade.Config) { c.ReadBack = "" })
	if v := verdicts(rep)["storm"]; v.Verdict != grade.Fail {
		t.Errorf("storm: %s (%s); want fail", v.Verdict, v.Why)
	}
}

func TestAFingerprintOfTheBytesFailsFieldOrder(t *testing.T) {
	t.Parallel()
	v := verdicts(check(t, newTarget(t, flaws{bytesFingerprint: true}), func(c *grade.Config) { c.Only = []string{"field-order"} }))
	if r := v["field-order"]; r.Verdict != grade.Fail || !strings.Contains(r.Why, "422") {
		t.Errorf("field-order: %s (%s); want a fail naming the 422", r.Verdict, r.Why)
	}
}

func TestSharedKeysFailTenants(t *testing.T) {
	t.Parallel()
	v := verdicts(check(t, newTarget(t, flaws{sharedKeys: true}), func(c *grade.Config) { c.Only = []string{"tenants"} }))
	if r := v["tenants"]; r.Verdict != grade.Fail {
		t.Errorf("tenants: %s (%s); want fail", r.Verdict, r.Why)
	}
}

func TestRetentionWaitsTheDeclaredLifetime(t *testing.T) {
	t.Parallel()
	srv := newTarget(t, flaws{retention: 200 * time.Millisecond})
	v := verdicts(check(t, srv, func(c *grade.Config) { c.Only, c.Retention = []string{"retention"}, 200*time.Millisecond }))
	if r := v["retention"]; r.Verdict != grade.Pass {
		t.Errorf("retention: %s (%s); want pass", r.Verdict, r.Why)
	}
	// Declared shorter than it is: the key still replays.
	v = verdicts(check(t, newTarget(t, flaws{}), func(c *grade.Config) { c.Only, c.Retention = []string{"retention"}, 100*time.Millisecond }))
	if r := v["retention"]; r.Verdict != grade.Fail {
		t.Errorf("retention on a target that never forgets: %s (%s); want fail", r.Verdict, r.Why)
	}
}

func TestTooFastToCatchIsNotAPass(t *testing.T) {
	t.Parallel()
	v := verdicts(check(t, newTarget(t, flaws{}), func(c *grade.Config) { c.Only, c.SlowHeader = []string{"in-flight"}, nil }))
	if r := v["in-flight"]; r.Verdict != grade.Unverified || !strings.Contains(r.Why, "-slow-header") {
		t.Errorf("in-flight: %s (%s); want could not verify, pointing at -slow-header", r.Verdict, r.Why)
	}
}

// TestARetryShedOrCrossedIsNotAFail: a retry the target sheds (503 with
// Retry-After) while the first request works, or one taken in before the
// first request (which is then told 409), shows nothing of what the target
// does with a request in flight: could not verify, saying which.
func TestARetryShedOrCrossedIsNotAFail(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{"shed": "was shed", "crossed": "crossed on the way"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tg := &target{keys: map[string]*entry{}, charges: map[string][]string{}}
			var slow atomic.Int32
			retried := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				first, retry := r.Method == http.MethodPost && r.Header.Get("Work-Ms") != "", r.Method == http.MethodPost && r.Header.Get("Work-Ms") == "" && slow.Load() > 0
				switch {
				case first && name == "crossed":
					slow.Add(1)
					<-retried // the retry overtook it, and is done
					w.Header().Set("Retry-After", "1")
					problem(w, http.StatusConflict, "idempotency_in_progress")
					return
				case first:
					slow.Add(1)
					defer slow.Add(-1)
				case retry && name == "shed":
					w.Header().Set("Retry-After", "1")
					problem(w, http.StatusServiceUnavailable, "lab_busy")
					return
				case retry:
					tg.ServeHTTP(w, r)
					slow.Add(-1)
					close(retried)
					return
				}
				tg.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			r := verdicts(check(t, srv, func(c *grade.Config) { c.Only = []string{"in-flight"} }))["in-flight"]
			if r.Verdict != grade.Unverified || !strings.Contains(r.Why, want) {
				t.Errorf("in-flight: %s (%s); want could not verify, saying it %s", r.Verdict, r.Why, want)
			}
		})
	}
}

// TestItSendsOnlyToTheTarget: a Location on another host is never
// followed, and a read-back on another host is refused before anything is
// sent.
func TestItSendsOnlyToTheTarget(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
	t.Cleanup(other.Close)
	var first atomic.Bool
	accepting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if first.CompareAndSwap(false, true) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":"ch_1"}`)
			return
		}
		w.Header().Set("Location", other.URL+"/operations/1")
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(accepting.Close)
	rep, err := grade.Run(context.Background(), grade.Config{Target: accepting.URL + "/charges", Only: []string{"sf-string"}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("%d requests reached another host", n)
	}
	if v := verdicts(rep)["sf-string"]; v.Verdict != grade.Fail {
		t.Errorf("sf-string: %s (%s); want fail (the retry never resolved)", v.Verdict, v.Why)
	}
	_, err = grade.Run(context.Background(), grade.Config{Target: accepting.URL + "/charges", ReadBack: other.URL + "/charges?key={key}"})
	if err == nil || !strings.Contains(err.Error(), "target's host") {
		t.Errorf("a read-back on another host: %v; want it refused", err)
	}
}

func TestAFirstRequestRefusedStopsTheCheck(t *testing.T) {
	t.Parallel()
	_, err := grade.Run(context.Background(), grade.Config{Target: newTarget(t, flaws{}).URL + "/charges"}) // no token: 401
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("without a token: %v; want the check stopped, naming the 401", err)
	}
}

// TestABusyFirstAnswerIsRetried: a target that sheds the check's first
// request (503 with Retry-After) is asked again, as a client would, and
// the check goes on.
func TestABusyFirstAnswerIsRetried(t *testing.T) {
	t.Parallel()
	tg := &target{keys: map[string]*entry{}, charges: map[string][]string{}}
	var shed atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && shed.CompareAndSwap(false, true) {
			w.Header().Set("Retry-After", "0")
			problem(w, http.StatusServiceUnavailable, "store_unavailable")
			return
		}
		tg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	rep := check(t, srv, nil)
	if !shed.Load() || !rep.Passed() {
		t.Errorf("shed first: %v, failed %v; want the first request shed, then every case passed", shed.Load(), rep.Failed)
	}
}
