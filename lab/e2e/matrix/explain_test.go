package matrix_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/lease"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
	"github.com/idempotency-lab/lab/variants/rediscache"
	"github.com/idempotency-lab/lab/variants/unsafestore"
)

// TestExplanationsOfChargedKeys runs cases of the matrix twice on one key —
// first fresh, then with the key's history — and checks that each
// explanation's claims are the run's own figures. TestMatrix holds every
// cell's fresh run to its figures; these cases take a charged key down
// each road its explanation knows: the store still knew the key (it added
// nothing), the design keeps none (unsafe), several replicas charged
// (memory), the store no longer held it (a restart, the window's end) and
// the claim a crash left.
func TestExplanationsOfChargedKeys(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.FullConfig(t))
	id := a.Public()
	second := id.Second()
	for _, c := range experiment.Cases() {
		if !slices.Contains([]string{"retries", "replicas", "store_restart", "expired", "crash_after_claim"}, c.Name) {
			continue
		}
		for _, store := range []lab.StoreName{unsafestore.Name, memory.Name, redis.Name, postgres.Name, lease.Name, rediscache.Name} {
			key := fmt.Sprintf("explain-%s-%s", c.Name, store)
			spec := experiment.Spec{
				Store: store, Scenario: c.Scenario, Key: key, Account: "acct-1", AmountCents: 2500, Attempts: c.Attempts,
				Namespace: id.Namespace, Tenant: id.Tenant, Token: id.Token, OtherTenant: second.Tenant, OtherToken: second.Token, Faults: c.Faults,
			}
			for pass, prior := range []string{"fresh", "charged"} {
				rep, err := a.Service().Run(t.Context(), spec, c.Replicas)
				if err != nil {
					t.Fatalf("%s/%s/%s: %v", c.Name, store, prior, err)
				}
				if pass == 1 && rep.KeyCharges-rep.ChargesApplied == 0 {
					t.Errorf("%s/%s: the first pass charged nothing: no history to explain", c.Name, store)
				}
				e2e.CheckExplanation(t, fmt.Sprintf("%s/%s/%s", c.Name, store, prior), rep)
			}
		}
	}
}
