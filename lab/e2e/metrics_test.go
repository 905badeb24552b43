package e2e_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
)

// TestOldestInFlightGauge: while a slow charge holds its key, the gauge of
// the oldest operation in flight grows for its store; once the charge is
// done it falls back to zero.
func TestOldestInFlightGauge(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, effectsConfig(t))
	for _, store := range []lab.StoreName{memory.Name, postgres.Name} {
		t.Run(string(store), func(t *testing.T) {
			series := `lab_oldest_inflight_key_age_seconds{store="` + string(store) + `"}`
			done := make(chan error, 1)
			go func() {
				resp, err := postWithFault(t, a.URL(), store, "k-gauge-"+string(store), "slow; work_ms=1500")
				if err == nil && resp.StatusCode != http.StatusCreated {
					err = errStatus(resp.StatusCode)
				}
				done <- err
			}()
			seen := 0.0
			for deadline := time.Now().Add(10 * time.Second); seen < 0.3; time.Sleep(20 * time.Millisecond) {
				seen = scrape(t, a.URL())[series]
				if time.Now().After(deadline) {
					t.Fatalf("%s never rose while a charge was in flight (last %v)", series, seen)
				}
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if after := scrape(t, a.URL())[series]; after != 0 {
				t.Fatalf("%s = %v once nothing is in flight, want 0", series, after)
			}
		})
	}
}

type errStatus int

func (e errStatus) Error() string { return http.StatusText(int(e)) }
