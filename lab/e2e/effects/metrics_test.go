package effects_test

import (
	"net/http"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
)

// TestOldestInFlightGauge: while a slow charge holds its key, the gauge of
// the oldest operation in flight grows for its store; once the charge is
// done it falls back to zero.
func TestOldestInFlightGauge(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.EffectsConfig(t))
	for _, store := range []lab.StoreName{memory.Name, postgres.Name} {
		t.Run(string(store), func(t *testing.T) {
			t.Parallel()
			series := `lab_oldest_inflight_key_age_seconds{store="` + string(store) + `"}`
			done := make(chan error, 1)
			go func() {
				// Slow enough that a loaded machine still scrapes it in flight.
				resp, err := e2e.PostWithFault(a.URL(), store, "k-gauge-"+string(store), "slow; work_ms=5000")
				if err == nil && resp.Status != http.StatusCreated {
					err = errStatus(resp.Status)
				}
				done <- err
			}()
			labtest.Eventually(t, series+" rising while a charge is in flight", func() bool {
				return scrape(t, a.URL())[series] >= 0.3
			})
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
