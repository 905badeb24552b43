package api

import (
	"context"
	"errors"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/variant"
)

// FuzzRouteQuery holds every route's query check, and a run's fault
// parameters, to one rule: any query is accepted or refused with an
// *InvalidError naming a parameter — never a panic, never another error.
func FuzzRouteQuery(f *testing.F) {
	for _, seed := range []string{"", "key=order-4711&attempts=5&amount=2500", "%zz", "a=%00", "limit=20&limit=21",
		"fault=slow&work_ms=300&ttl_ms=100", "fault=expired&work_ms=1", "pretty", "pretty=yes", "token=x", "store=redis+postgres",
		"fault=none&ttl_ms=5", "window_ms=%00", ";", "a;b=c", "fault=stale_worker&ttl_ms=200&work_ms=800"} {
		f.Add(seed)
	}
	reg, err := variant.NewRegistry(
		variant.Variant{Name: "keyed", RequiresKey: true, Effects: "outbox", Lifetime: "claim TTL", Crash: variant.CrashLeavesClaim,
			Open: func(context.Context, variant.Deps) (lab.Store, error) { return nil, nil }},
		variant.Variant{Name: "plain", Effects: "direct", Open: func(context.Context, variant.Deps) (lab.Store, error) { return nil, nil }})
	if err != nil {
		f.Fatal(err)
	}
	s := &Server{deps: Deps{Variants: reg}}
	routes := s.routes(nil)
	f.Fuzz(func(t *testing.T, raw string) {
		for _, rt := range routes {
			err := checkQuery(raw, append([]string{prettyParam}, rt.params...))
			var inv *lab.InvalidError
			if err != nil && (!errors.As(err, &inv) || inv.Param == "") {
				t.Fatalf("%s?%q: %v, want nil or an *InvalidError naming a parameter", rt.path, raw, err)
			}
		}
		q, err := wire.ParseQuery(raw)
		if err != nil {
			return
		}
		for _, store := range []lab.StoreName{"keyed", "plain"} {
			fault, err := q.Name("fault", "none")
			if err != nil {
				continue
			}
			spec := experiment.Spec{Store: store}
			err = s.faultParamsApply(q, &spec, fault)
			var inv *lab.InvalidError
			if err != nil && (!errors.As(err, &inv) || inv.Param == "") {
				t.Fatalf("fault params of %q on %s: %v", raw, store, err)
			}
		}
	})
}
