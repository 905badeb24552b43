package api_test

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/signature"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants"
	"github.com/idempotency-lab/lab/variants/memory"
)

var update = flag.Bool("update", false, "rewrite testdata/answers/ from the answers of a running lab")

// answersDir holds one file per answer type: its JSON names, one a line.
const answersDir = "testdata/answers"

// webhookSecret lets the test sign webhooks as the lab's own provider does.
const webhookSecret = "answers-test-webhook-secret"

// answer is the JSON of real answers of one type, and where to look below
// its top members: "stores.*" reads each value of the object at stores (a
// map keyed by name), "outbox[]" each element of the array at outbox,
// "faults" the object at faults. Values of types from other packages
// (reports, events, key states) are named, not read into: they are not
// this package's answers.
type answer struct {
	bodies  [][]byte
	descend []string
}

// TestAnswerNames pins the JSON names of every answer of the lab's routes,
// read from a running lab, to testdata/answers/<type>.txt: attendees'
// scripts read those names. go test -run TestAnswerNames -update rewrites
// the files after a deliberate change.
func TestAnswerNames(t *testing.T) {
	answers := collectAnswers(t)
	if *update {
		if err := os.RemoveAll(answersDir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(answersDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for typ, a := range answers {
		t.Run(typ, func(t *testing.T) {
			if a == nil {
				t.Skip("no real answer on this machine: see the parent test's log")
			}
			got := jsonNames(t, a)
			path := filepath.Join(answersDir, typ+".txt")
			if *update {
				if err := os.WriteFile(path, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test -run TestAnswerNames -update writes it)", err)
			}
			want := strings.Fields(string(b))
			if !slices.Equal(got, want) {
				t.Errorf("%s answers with the names\n%s\nwant\n%s\n(attendees' scripts read these names; after a deliberate change, go test -run TestAnswerNames -update)",
					typ, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
	if *update {
		return
	}
	files, err := filepath.Glob(filepath.Join(answersDir, "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if _, ok := answers[strings.TrimSuffix(filepath.Base(f), ".txt")]; !ok {
			t.Errorf("%s names an answer no route gave: remove it, or give the test its route", f)
		}
	}
}

// collectAnswers drives a running lab (every built-in design, those
// without a service reported unavailable) through each route that answers
// with one of this package's types, and keeps the answers by type.
func collectAnswers(t *testing.T) map[string]*answer {
	t.Helper()
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr = "127.0.0.1:0"
	cfg.EmbedPostgres, cfg.EmbedRedis = false, false
	cfg.WebhookSecret = webhookSecret
	a := labtest.Start(t, cfg)
	base := a.URL()
	acme := http.Header{"Authorization": {"Bearer " + labtest.Acme}}

	out := map[string]*answer{}
	keep := func(typ string, r labtest.Reply, status int, descend ...string) {
		t.Helper()
		if r.Status != status {
			t.Fatalf("%s: status %d, want %d: %s", typ, r.Status, status, r.Body)
		}
		if out[typ] == nil {
			out[typ] = &answer{descend: descend}
		}
		out[typ].bodies = append(out[typ].bodies, r.Body)
	}
	get := func(path string) labtest.Reply { return labtest.Do(t, http.MethodGet, base+path, acme, "") }
	post := func(path string) labtest.Reply { return labtest.Do(t, http.MethodPost, base+path, acme, "") }

	keep("Index", labtest.Do(t, http.MethodGet, base+"/", http.Header{"Accept": {"application/json"}}, ""), http.StatusOK,
		"variants[]", "stores.*", "faults")
	keep("healthAnswer", get("/health"), http.StatusOK)
	keep("readyAnswer", get("/ready"), http.StatusOK, "dependencies.*")
	keep("readyAnswer", readyWithProviderDown(t), http.StatusServiceUnavailable, "dependencies.*")

	// A charge whose receipt stays in the outbox: the relay is held, so
	// the event can be re-queued and the outbox lists it.
	a.HoldDelivery(true)
	charged := labtest.Charge(t, base, memory.Name, labtest.Acme, "answers-k1", `{"account":"acct-1","amount_cents":2500}`)
	if charged.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", charged.Status, charged.Body)
	}
	var charge struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(charged.Body, &charge); err != nil {
		t.Fatal(err)
	}
	keep("keyStateAnswer", get("/idempotency/state?store=memory&key=answers-k1"), http.StatusOK)
	keep("keyChargesAnswer", get("/charges?store=memory&key=answers-k1"), http.StatusOK)
	keep("stateAnswer", get("/idempotency/state"), http.StatusOK, "stores.*", "keys.*")
	outbox := get("/outbox")
	keep("outboxAnswer", outbox, http.StatusOK, "outbox[]")
	var listed struct {
		Events []struct {
			ID string `json:"event_id"`
		} `json:"events"`
	}
	if err := json.Unmarshal(outbox.Body, &listed); err != nil || len(listed.Events) == 0 {
		t.Fatalf("the outbox lists no event (%v): %s", err, outbox.Body)
	}
	keep("requeueAnswer", post("/outbox/"+listed.Events[0].ID+"/retry"), http.StatusOK)
	a.HoldDelivery(false)

	// A webhook for the charge with another amount is recorded as a
	// mismatch; the same event again is a duplicate.
	event := fmt.Sprintf(`{"event_id":"evt_answers","type":"capture.succeeded","data":{"charge_id":%q,"tenant":"acme","capture_id":"cap_x","amount_cents":1,"currency":"USD"}}`, charge.ID)
	for range 2 {
		h := http.Header{signature.Header: {signature.Sign([]byte(webhookSecret), time.Now(), []byte(event))}, "Content-Type": {"application/json"}}
		keep("webhookAnswer", labtest.Do(t, http.MethodPost, base+"/webhooks/provider", h, event), http.StatusOK)
	}

	keep("openRunAnswer", post("/lab/runs"), http.StatusCreated)
	if r := get("/charge-idempotent?store=memory&key=answers-run&attempts=2"); r.Status != http.StatusOK {
		t.Fatalf("run: %d %s", r.Status, r.Body)
	}
	keep("runsAnswer", get("/lab/runs"), http.StatusOK)
	keep("summaryAnswer", get("/diagnostics/summary"), http.StatusOK, "interpretation", "variants.*")
	keep("restartAnswer", post("/lab/restart-store?store=memory&key_prefix=answers-"), http.StatusOK)
	keep("joinAnswer", labtest.Do(t, http.MethodPost, base+"/lab/join", nil, ""), http.StatusCreated)
	keep("resetAnswer", post("/reset-lab"), http.StatusOK)
	matrixLines(t, keep)
	// The line that ends a matrix which could not finish: no run here
	// fails on purpose, so it is the type's own encoding.
	keep("matrixFailure", labtest.Reply{Status: http.StatusOK, Body: api.MatrixFailureLine(lab.Problem{
		Title: "Store unavailable", Status: http.StatusServiceUnavailable, Code: "store_unavailable", Detail: "d", Param: "p", ChargeID: "c"})}, http.StatusOK, "error")
	// The failover fault's two steps, on the Redis pair the lab started.
	if how := a.PairUnavailable(); how != "" {
		if os.Getenv("LAB_REQUIRE_SERVICES") == "1" {
			t.Fatalf("the failover answer needs the Redis pair: %s", how)
		}
		t.Logf("failoverAnswer not checked: %s", how)
		out["failoverAnswer"] = nil
	} else {
		keep("failoverAnswer", post("/lab/failover?step=hold"), http.StatusOK)
		keep("failoverAnswer", post("/lab/failover?step=promote"), http.StatusOK)
	}
	return out
}

// readyWithProviderDown is GET /ready of a lab whose provider does not
// answer: the dependency says why.
func readyWithProviderDown(t *testing.T) labtest.Reply {
	t.Helper()
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr = "127.0.0.1:0"
	cfg.EmbedPostgres, cfg.EmbedRedis, cfg.RedisPair = false, false, false
	cfg.ProviderURL = "http://127.0.0.1:1" // nothing listens on port 1
	cfg.ProviderAPIKey, cfg.WebhookSecret = labtest.ProviderKey, webhookSecret
	cfg.ProviderTimeout = 200 * time.Millisecond
	return labtest.Do(t, http.MethodGet, labtest.Start(t, cfg).URL()+"/ready", nil, "")
}

// matrixLines reads GET /lab/matrix?format=ndjson of a lab offering one
// design: the layout, each cell as it is decided, and the end.
func matrixLines(t *testing.T, keep func(string, labtest.Reply, int, ...string)) {
	t.Helper()
	cfg := app.DefaultConfig()
	cfg.Variants = []variant.Variant{memory.Variant()}
	cfg.Addr = "127.0.0.1:0"
	cfg.EmbedPostgres, cfg.EmbedRedis, cfg.RedisPair = false, false, false
	r := labtest.Do(t, http.MethodGet, labtest.Start(t, cfg).URL()+"/lab/matrix?format=ndjson", nil, "")
	if r.Status != http.StatusOK {
		t.Fatalf("matrix: %d %s", r.Status, r.Body)
	}
	sc := bufio.NewScanner(bytes.NewReader(r.Body))
	sc.Buffer(nil, 1<<20)
	for n := 0; sc.Scan(); n++ {
		var line map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("matrix line %d: %v: %s", n, err, sc.Bytes())
		}
		typ := "matrixProgress"
		switch {
		case n == 0:
			typ = "matrixLayout"
		case line["error"] != nil:
			t.Fatalf("the matrix stopped: %s", sc.Bytes())
		case line["wall_ms"] != nil:
			typ = "matrixDone"
		}
		keep(typ, labtest.Reply{Status: r.Status, Body: bytes.Clone(sc.Bytes())}, http.StatusOK)
	}
}

// jsonNames lists the JSON names of the answers, sorted: each top member,
// and below it the members at the answer's descend paths (a map's values
// under "name.*", an array's elements under "name[]").
func jsonNames(t *testing.T, a *answer) []string {
	t.Helper()
	names := map[string]bool{}
	var walk func(path string, v json.RawMessage)
	walk = func(path string, v json.RawMessage) {
		var members map[string]json.RawMessage
		if err := json.Unmarshal(v, &members); err != nil {
			t.Fatalf("%s is not a JSON object: %s", cmp.Or(path, "the answer"), v)
		}
		for name, value := range members {
			p := name
			if path != "" {
				p = path + "." + name
			}
			names[p] = true
			switch {
			case slices.Contains(a.descend, p):
				walk(p, value)
			case slices.Contains(a.descend, p+".*"):
				var byName map[string]json.RawMessage
				if err := json.Unmarshal(value, &byName); err != nil || len(byName) == 0 {
					t.Fatalf("%s holds no object to read names from: %s", p, value)
				}
				for _, each := range byName {
					walk(p+".*", each)
				}
			case slices.Contains(a.descend, p+"[]"):
				var elems []json.RawMessage
				if err := json.Unmarshal(value, &elems); err != nil || len(elems) == 0 {
					t.Fatalf("%s holds no element to read names from: %s", p, value)
				}
				for _, each := range elems {
					walk(p+"[]", each)
				}
			}
		}
	}
	for _, b := range a.bodies {
		walk("", b)
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
