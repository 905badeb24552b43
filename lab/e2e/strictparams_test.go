package e2e_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab/api"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/unsafestore"
)

// TestEveryRouteRefusesStrayParameters: every route the index lists refuses
// a parameter it does not take, a repeated one, and a malformed query, with
// the same 400 naming it — whether the route would have read it or not.
func TestEveryRouteRefusesStrayParameters(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	index := labtest.Decode[api.Index](t, labtest.Do(t, http.MethodGet, a.URL()+"/", nil, ""))
	if len(index.RouteParams) < 20 {
		t.Fatalf("the index lists %d routes' parameters", len(index.RouteParams))
	}
	for route, params := range index.RouteParams {
		method, path, _ := strings.Cut(route, " ")
		path = strings.NewReplacer(":id", "x", ":key", "k").Replace(path)
		for query, want := range map[string]string{"bogus=1": "bogus", "%zz": "query", "a=%00": "a"} {
			r := labtest.Do(t, method, a.URL()+path+"?"+query, nil, "")
			labtest.WantProblem(t, route+"?"+query, r, http.StatusBadRequest, "invalid_parameter", want)
		}
		if len(params) > 1 {
			p := params[1] // the first of its own, after pretty
			r := labtest.Do(t, method, a.URL()+path+"?"+p+"=1&"+p+"=2", nil, "")
			labtest.WantProblem(t, route+" with "+p+" twice", r, http.StatusBadRequest, "invalid_parameter", p)
		}
	}
}

// TestRunsReadEveryParameterStrictly: the junk that used to run and charge
// (a fault parameter without its fault, an unparsable or repeated one) is a
// 400 naming it, and nothing is charged; a parameter of the chosen fault
// goes on any store, the note saying where it has no effect.
func TestRunsReadEveryParameterStrictly(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, postgres.Name))
	for _, tc := range []struct{ query, param string }{
		{"/charge-unsafe?key=junk-1&work_ms=-1", "work_ms"},
		{"/charge-unsafe?key=junk-2&work_ms=abc&work_ms=xyz", "work_ms"},
		{"/charge-unsafe?key=junk-3&window_ms=%00", "window_ms"},
		{"/charge-unsafe?key=junk-4&work_ms=300", "work_ms"},                                // no fault reads it
		{"/charge-idempotent?store=memory&key=junk-5&fault=expired&work_ms=300", "work_ms"}, // another fault's
		{"/charge-idempotent?store=memory&key=junk-6&fault=slow&window_ms=300", "window_ms"},
		{"/charge-idempotent?store=memory&key=junk-7&fault=store_restart&ttl_ms=300", "ttl_ms"},
		{"/charge-unsafe?key=junk-8&store=memory", "store"},
		{"/charge-idempotent?store=memory&key=junk-9&tenant=globex", "tenant"},
		{"/charge-idempotent?store=memory&key=junk-10&tokn=x", "tokn"},
	} {
		r := labtest.Do(t, http.MethodGet, a.URL()+tc.query, nil, "")
		labtest.WantProblem(t, tc.query, r, http.StatusBadRequest, "invalid_parameter", tc.param)
	}
	for _, store := range []string{"memory", "unsafe"} {
		for i := 1; i <= 10; i++ {
			key := fmt.Sprintf("junk-%d", i)
			name := memory.Name
			if store == "unsafe" {
				name = unsafestore.Name
			}
			if n := e2e.KeyCharges(t, a, "acme", name, key); n != 0 {
				t.Errorf("%s: %d charges for %s after a refused run", store, n, key)
			}
		}
	}
	// ttl_ms with the slow fault, on a store whose claims have no TTL: it
	// runs, and the note says the parameter did nothing there.
	rep := e2e.Run(t, a.URL(), memory.Name, "key=fresh&fault=slow&work_ms=50&ttl_ms=20&attempts=2")
	if !strings.Contains(rep.Note, "ttl_ms has no effect on memory") {
		t.Errorf("note %q: want it to say ttl_ms did nothing on memory", rep.Note)
	}
	// The peer lab's percent-decoding failure is one 400 on every route.
	for _, path := range []string{"/diagnostics/summary?%zz", "/idempotency/state?%zz", "/outbox?%zz", "/health?%zz"} {
		if r := labtest.Do(t, http.MethodGet, a.URL()+path, nil, ""); r.Status != http.StatusBadRequest {
			t.Errorf("%s: %d", path, r.Status)
		}
	}
}
