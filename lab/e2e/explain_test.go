package e2e_test

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/lease"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
	"github.com/idempotency-lab/lab/variants/rediscache"
	"github.com/idempotency-lab/lab/variants/unsafestore"
)

// TestExplanationsMatchTheirNumbers runs every case of the matrix on every
// store twice on one key — first fresh, then with the key's history — and
// checks that each explanation's claims are the run's own figures.
func TestExplanationsMatchTheirNumbers(t *testing.T) {
	t.Parallel()
	cfg := fullConfig(t)
	cfg.RedisPair = true // the failover case
	a := labtest.Start(t, cfg)
	id := a.Public()
	second := id.Second()
	for _, c := range experiment.Cases() {
		for _, store := range []lab.StoreName{unsafestore.Name, memory.Name, redis.Name, postgres.Name, lease.Name, rediscache.Name} {
			if c.NeedsPGPair && !slices.Contains([]lab.StoreName{postgres.Name, lease.Name, rediscache.Name}, store) {
				continue // n/a, as in the matrix: no key of it in PostgreSQL to lose
			}
			key := fmt.Sprintf("explain-%s-%s", c.Name, store)
			spec := experiment.Spec{
				Store: store, Scenario: c.Scenario, Key: key, Account: "acct-1", AmountCents: 2500, Attempts: c.Attempts,
				Namespace: id.Namespace, Tenant: id.Tenant, Token: id.Token, OtherTenant: second.Tenant, OtherToken: second.Token, Faults: c.Faults,
			}
			if c.OrderID {
				spec.OrderID = "order-" + key
			}
			for pass, prior := range []string{"fresh", "charged"} {
				rep, err := a.Service().Run(t.Context(), spec, c.Replicas)
				if err != nil {
					t.Fatalf("%s/%s/%s: %v", c.Name, store, prior, err)
				}
				if pass == 1 && rep.KeyCharges-rep.ChargesApplied == 0 {
					continue // the first pass charged nothing: no history to explain
				}
				checkClaims(t, fmt.Sprintf("%s/%s/%s", c.Name, store, prior), rep)
			}
		}
	}
}

// checkClaims holds an explanation to the figures of its own report.
func checkClaims(t *testing.T, name string, rep experiment.Report) {
	t.Helper()
	text := rep.Explanation
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s: %s\n  explanation: %s\n  figures: verdict %s, added %d, key charges %d, replays %d, 409 %d, 422 %d, key before %q",
			name, fmt.Sprintf(format, args...), text, rep.Verdict, rep.ChargesApplied, rep.KeyCharges, rep.IdempotencyHits,
			rep.InProgress, rep.Rejections, rep.KeyBefore)
	}
	if text == "" && rep.Verdict != lab.Inconclusive {
		fail("no explanation")
	}
	number := func(pattern string) (int, bool) {
		m := regexp.MustCompile(pattern).FindStringSubmatch(text)
		if m == nil {
			return 0, false
		}
		n, _ := strconv.Atoi(m[1])
		return n, true
	}
	earlier := rep.KeyCharges - rep.ChargesApplied
	if n, ok := number(`charged before this run \((\d+) charge`); ok && n != earlier {
		fail("says %d earlier charges, the ledger had %d", n, earlier)
	} else if !ok && earlier > 0 && rep.Verdict != lab.Inconclusive {
		fail("does not say the key had %d charge(s) before the run", earlier)
	}
	if strings.Contains(text, "added nothing") != (earlier > 0 && rep.ChargesApplied == 0 && rep.Verdict != lab.Inconclusive) {
		fail("'added nothing' against %d added", rep.ChargesApplied)
	}
	if n, ok := number(`charged (\d+) more`); ok && n != rep.ChargesApplied {
		fail("says %d more, the run added %d", n, rep.ChargesApplied)
	}
	for pattern, want := range map[string]int{`(\d+) replayed`: rep.IdempotencyHits, `(\d+) got 409`: rep.InProgress, `(\d+) got 422`: rep.Rejections} {
		if n, ok := number(pattern); ok && n != want {
			fail("%q says %d, the report %d", pattern, n, want)
		}
	}
	if strings.HasPrefix(text, "Unexpectedly") && (earlier > 0 || rep.Verdict == rep.ExpectedVerdict) {
		fail("'Unexpectedly' on a %s verdict (usually %s, %d earlier charges)", rep.Verdict, rep.ExpectedVerdict, earlier)
	}
	// A break is a duplicate in the ledger, or (a PostgreSQL failover) a
	// charge a client was told of that the surviving books lost.
	if (rep.Verdict == lab.Breaks) != (rep.DuplicatesApplied > 0 || len(rep.LostAcknowledged) > 0) {
		fail("verdict %s with %d duplicates applied and %v acknowledged charges lost", rep.Verdict, rep.DuplicatesApplied, rep.LostAcknowledged)
	}
}
