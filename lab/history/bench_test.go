package history_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab/history"
)

// storm is a 64-attempt run's history as the runner records it: the
// ledger read before, every attempt released together (one charges, the
// others wait and replay, a few see 409 first and try again), and the
// ledger read after. twice makes a second attempt charge too, as memory
// on several replicas does.
func storm(twice bool) history.History {
	h := history.History{Run: "run_bench"}
	read := ledger(-50, -10)
	read.Before = true
	h.Ops = append(h.Ops, read)
	ids := []string{"ch_first"}
	for c := 1; c <= 64; c++ {
		call := int64(c % 7)
		switch {
		case c == 1:
			h.Ops = append(h.Ops, charge(c, call, 900, 201, "ch_first", false))
		case twice && c == 2:
			h.Ops = append(h.Ops, charge(c, call, 950, 201, "ch_second", false))
			ids = append(ids, "ch_second")
		case c%5 == 0:
			h.Ops = append(h.Ops, charge(c, call, 200, 409, "", false), charge(c, 260, 1200, 201, "ch_first", true))
		default:
			h.Ops = append(h.Ops, charge(c, call, 1000+int64(c), 201, "ch_first", true))
		}
	}
	h.Ops = append(h.Ops, ledger(2000, 2100, ids...))
	return h
}

// BenchmarkCheck64Attempts is the cost the proof adds to a 64-attempt run,
// after its figures are in: go test -run '^$' -bench Check ./lab/history/
func BenchmarkCheck64Attempts(b *testing.B) {
	for _, tc := range []struct {
		name  string
		twice bool
		want  history.Verdict
	}{{"linearizable", false, history.Linearizable}, {"violation", true, history.Violation}} {
		b.Run(tc.name, func(b *testing.B) {
			h := storm(tc.twice)
			for b.Loop() {
				if res := history.Check(h, history.DefaultTimeout); res.Verdict != tc.want {
					b.Fatal(fmt.Sprint(res.Verdict, res.Why))
				}
			}
		})
	}
}

// TestAWideViolationIsFoundAndDrawn: 64 concurrent attempts, two of them
// charging, are a violation at once (no search could finish over their
// orders within the bound), and the picture is still drawn.
func TestAWideViolationIsFoundAndDrawn(t *testing.T) {
	t.Parallel()
	res := history.Check(storm(true), history.DefaultTimeout)
	if res.Verdict != history.Violation || res.Why == "" {
		t.Fatalf("got %s: %s", res.Verdict, res.Why)
	}
	var b strings.Builder
	if err := res.WriteHTML(&b); err != nil || !strings.Contains(b.String(), "attempt 2") {
		t.Fatalf("picture of %d bytes: %v", b.Len(), err)
	}
}
