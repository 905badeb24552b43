package e2e_test

import (
	"slices"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/lease"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/phases"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
	"github.com/idempotency-lab/lab/variants/unsafestore"
)

// TestAttemptsReportTheirPhases: each answer carries the server's phases
// (Server-Timing), and the runner places them on the run's time axis. On
// every store the charging attempt passes claim, work, charge and commit in
// that order inside its own try (phases calls the provider before its
// commit); the others end with a replay; the unsafe
// store, which stores nothing, charges without claim or commit.
func TestAttemptsReportTheirPhases(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.FullConfig(t))
	for _, store := range []lab.StoreName{memory.Name, redis.Name, postgres.Name, lease.Name, phases.Name, unsafestore.Name} {
		path := "/charge-idempotent?store=" + string(store) + "&"
		if store == unsafestore.Name {
			path = "/charge-unsafe?"
		}
		rep := labtest.Get[experiment.Report](t, a.URL()+path+"key=fresh&attempts=3&fault=slow&work_ms=80&ttl_ms=10000", "")
		charged, replays := 0, 0
		for _, res := range rep.Timeline {
			for _, try := range res.Tries {
				var names []string
				for i, p := range try.Phases {
					names = append(names, p.Name)
					if p.AtMS < try.StartMS || p.AtMS > try.StartMS+try.LatencyMS || i > 0 && p.AtMS < try.Phases[i-1].AtMS {
						t.Errorf("%s: phase %s at %.2f ms, outside its try (%.2f..%.2f) or out of order", store, p.Name, p.AtMS, try.StartMS, try.StartMS+try.LatencyMS)
					}
				}
				switch {
				case try.Status == 201 && !try.Replayed:
					charged++
					want := []string{lab.PhaseClaim, lab.PhaseWork, lab.PhaseCharge, lab.PhaseCommit}
					switch store {
					case unsafestore.Name:
						want = []string{lab.PhaseWork, lab.PhaseCharge}
					case phases.Name: // the provider's capture between the charge and the commit
						want = []string{lab.PhaseClaim, lab.PhaseWork, lab.PhaseCharge, lab.PhaseProvider, lab.PhaseCommit}
					}
					if !slices.Equal(names, want) {
						t.Errorf("%s: the charging try passed %v, want %v", store, names, want)
					}
				case try.Replayed:
					replays++
					if !slices.Equal(names, []string{lab.PhaseReplay}) {
						t.Errorf("%s: a replay passed %v", store, names)
					}
				}
			}
		}
		wantCharged := 1
		if store == unsafestore.Name {
			wantCharged = 3
		}
		if charged != wantCharged || charged != rep.ChargesApplied {
			t.Errorf("%s: %d charging tries, ledger %d, want %d", store, charged, rep.ChargesApplied, wantCharged)
		}
		if store != unsafestore.Name && replays == 0 {
			t.Errorf("%s: no replay in %+v", store, rep.Timeline)
		}
	}
}
