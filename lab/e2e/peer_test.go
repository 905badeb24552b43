package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// kind is a JSON value's kind, as the multi-language lab's answers have it.
type kind string

const (
	num kind = "number"
	str kind = "string"
	obj kind = "object"
	arr kind = "array"
	boo kind = "bool"
)

func kindOf(v any) kind {
	switch v.(type) {
	case float64:
		return num
	case string:
		return str
	case map[string]any:
		return obj
	case []any:
		return arr
	case bool:
		return boo
	}
	return "null"
}

// runFields are the fields of the peer lab's run answer.
var runFields = map[string]kind{
	"account": str, "amount_cents": num, "attempts": num, "balance_cents": num, "charges_applied": num,
	"dedupe_window_ms": num, "duplicates_applied": num, "duplicates_prevented": num, "idempotency_hits": num,
	"key": str, "lookup_overhead_ms": num, "note": str, "outbox_delivered": num, "outbox_pending": num,
	"overcharged_cents": num, "side_effect_transport": str, "side_effects_emitted": num, "variant": str, "wall_ms": num,
}

// TestPeerFields replays the multi-language lab's request sequence (its
// case 16, as attendees know it) and checks that every field it answers
// exists here with the same name and kind, and that the figures mean the
// same: after one idempotent run its receipt is already delivered.
func TestPeerFields(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	counters := map[string]kind{"runs": num, "attempts": num, "charges_applied": num, "duplicates_prevented": num,
		"duplicates_applied": num, "idempotency_hits": num, "side_effects_emitted": num, "overcharged_cents": num}
	row := map[string]kind{"key": str, "kind": str, "amount_cents": num, "at": str, "status": str, "via": str}
	steps := []struct {
		path   string
		fields map[string]kind
		nested map[string]map[string]kind // fields of an object (or of an array's rows), by field
		values map[string]any
	}{
		{path: "/health", fields: map[string]kind{"case": str, "stack": str, "status": str}, values: map[string]any{"status": "ok"}},
		{path: "/reset-lab", fields: map[string]kind{"message": str, "status": str}, values: map[string]any{"status": "reset"}},
		{path: "/charge-unsafe?key=order-4711&attempts=5&amount=2500", fields: runFields,
			values: map[string]any{"charges_applied": 5.0, "duplicates_applied": 4.0, "overcharged_cents": 10000.0, "side_effects_emitted": 5.0, "variant": "unsafe"}},
		{path: "/reset-lab", fields: map[string]kind{"message": str, "status": str}},
		{path: "/charge-idempotent?key=order-4711&attempts=5&amount=2500", fields: runFields,
			values: map[string]any{"charges_applied": 1.0, "duplicates_prevented": 4.0, "idempotency_hits": 4.0, "balance_cents": 2500.0,
				"outbox_delivered": 1.0, "outbox_pending": 0.0, "variant": "idempotent"}},
		{path: "/charge-idempotent?key=order-4711&attempts=5&amount=2500", fields: runFields,
			values: map[string]any{"charges_applied": 0.0, "duplicates_prevented": 5.0, "balance_cents": 2500.0}},
		{path: "/idempotency/state", fields: map[string]kind{"dedupe_window_ms": num, "key_count": num, "keys": obj, "ledger_cents": obj, "note": str},
			nested: map[string]map[string]kind{"keys.order-4711": {"age_ms": num, "expired": boo, "has_response": boo}},
			values: map[string]any{"key_count": 1.0}},
		{path: "/outbox?limit=20", fields: map[string]kind{"delivered": arr, "delivered_total": num, "limit": num, "note": str,
			"outbox": arr, "outbox_pending": num, "outbox_total": num},
			nested: map[string]map[string]kind{"outbox": row, "delivered": row}, values: map[string]any{"outbox_total": 1.0}},
		{path: "/diagnostics/summary", fields: map[string]kind{"case": str, "interpretation": obj, "outbox_delivered": num,
			"outbox_pending": num, "stack": str, "variants": obj},
			nested: map[string]map[string]kind{"variants.idempotent": counters, "variants.unsafe": counters,
				"interpretation": {"idempotent": str, "unsafe": str}}},
	}
	for i, st := range steps {
		r := labtest.Do(t, http.MethodGet, a.URL()+st.path, nil, "")
		var got map[string]any
		if err := json.Unmarshal(r.Body, &got); err != nil || r.Status != http.StatusOK {
			t.Fatalf("step %d %s: %d %s", i+1, st.path, r.Status, r.Body)
		}
		checkFields(t, fmt.Sprintf("step %d %s", i+1, st.path), got, st.fields)
		for path, fields := range st.nested {
			v := any(got)
			for _, part := range strings.SplitN(path, ".", 2) {
				v = v.(map[string]any)[part]
			}
			switch v := v.(type) {
			case map[string]any:
				checkFields(t, fmt.Sprintf("step %d %s: %s", i+1, st.path, path), v, fields)
			case []any:
				if len(v) == 0 {
					t.Errorf("step %d %s: %s is empty", i+1, st.path, path)
				}
				for _, r := range v {
					checkFields(t, fmt.Sprintf("step %d %s: %s row", i+1, st.path, path), r.(map[string]any), fields)
				}
			default:
				t.Errorf("step %d %s: %s is %v", i+1, st.path, path, v)
			}
		}
		for field, want := range st.values {
			if got[field] != want {
				t.Errorf("step %d %s: %s = %v, the peer lab answers %v", i+1, st.path, field, got[field], want)
			}
		}
	}
}

func checkFields(t *testing.T, where string, got map[string]any, want map[string]kind) {
	t.Helper()
	for field, k := range want {
		v, ok := got[field]
		switch {
		case !ok:
			t.Errorf("%s: no field %q", where, field)
		case kindOf(v) != k:
			t.Errorf("%s: %q is a %s, the peer lab's is a %s", where, field, kindOf(v), k)
		}
	}
}
