package failover_test

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb/throwaway"
)

// TestPGFailover fails the lab's PostgreSQL pair over twice in each
// replication mode, the pair rebuilt between runs, reading both servers'
// ledgers each time (that the loss is every time, not by chance, is the
// pair's own test: throwaway's TestFailoverLosesWhatAsyncAcknowledged). Asynchronous: the old primary committed the first
// attempt's charge and answered 201, the promoted standby never had it, the
// retry charged again and the provider captured both. Synchronous: the
// first attempt's commit waited and never answered, the retry charged
// once, nothing acknowledged was lost. The lab's own database holds none of
// it.
func TestPGFailover(t *testing.T) {
	t.Parallel()
	if _, err := throwaway.Find(); err != nil {
		t.Fatalf("the PostgreSQL pair needs the server binaries: %v", err)
	}
	const rounds = 2
	for _, mode := range []lab.Replication{lab.ReplicationAsync, lab.ReplicationSync} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			a := labtest.Start(t, e2e.EffectsConfig(t))
			for i := range rounds {
				rep := labtest.Get[experiment.Report](t, fmt.Sprintf("%s/charge-idempotent?store=postgres&fault=pg_failover&replication=%s&attempts=3&key=pgf-%s-%d",
					a.URL(), mode, mode, i), "")
				f := rep.Failover
				if f == nil || f.Replication != mode || len(f.OldPrimary) != 1 || len(f.NewPrimary) != 1 {
					t.Fatalf("round %d: evidence %+v (verdict %s: %s)", i, f, rep.Verdict, rep.Reason)
				}
				lost, surviving := f.OldPrimary[0].ChargeID, f.NewPrimary[0].ChargeID
				if !slices.Equal(f.Lost, []string{lost}) || lost == surviving {
					t.Fatalf("round %d: old primary %s, new %s, lost %v", i, lost, surviving, f.Lost)
				}
				first := rep.Timeline[0].Final()
				switch mode {
				case lab.ReplicationAsync:
					// The client holds an answer for a charge the surviving books lack.
					if first.Status != http.StatusCreated || rep.Verdict != lab.Breaks || !slices.Equal(rep.LostAcknowledged, []string{lost}) ||
						rep.ProviderCaptures != 2 || rep.CapturesWithoutCharge != 1 {
						t.Fatalf("round %d: first attempt %d, verdict %s, lost acknowledged %v, %d captures (%d without a charge): %s",
							i, first.Status, rep.Verdict, rep.LostAcknowledged, rep.ProviderCaptures, rep.CapturesWithoutCharge, rep.Reason)
					}
				case lab.ReplicationSync:
					// Its commit never answered: nothing acknowledged is gone.
					if first.Status != 0 || !f.CommitWaited || rep.Verdict != lab.Holds || len(rep.LostAcknowledged) != 0 ||
						rep.ProviderCaptures != 1 || rep.KeyCharges != 1 {
						t.Fatalf("round %d: first attempt %d, commit waited %v, verdict %s, lost acknowledged %v, %d captures, %d charges: %s",
							i, first.Status, f.CommitWaited, rep.Verdict, rep.LostAcknowledged, rep.ProviderCaptures, rep.KeyCharges, rep.Reason)
					}
				}
				if s := e2e.RunStats(t, a, rep.RunID); s.Charges != 0 || s.OutboxEvents != 0 {
					t.Fatalf("round %d: the lab's own database holds %+v of the run", i, s)
				}
			}
		})
	}
}

// TestPGFailoverOneAtATime: two namespaces fail the pair over at once; the
// second waits for the first to settle, and each run loses exactly its
// own first charge.
func TestPGFailoverOneAtATime(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.EffectsConfig(t))
	var wg sync.WaitGroup
	reps := make([]experiment.Report, 2)
	for i, token := range []string{labtest.Acme, labtest.Globex} {
		wg.Go(func() {
			r := labtest.Do(t, http.MethodPost, fmt.Sprintf("%s/charge-idempotent?store=lease&fault=pg_failover&attempts=3&key=both-%d", a.URL(), i), labtest.Bearer(token), "")
			reps[i] = labtest.Decode[experiment.Report](t, r)
		})
	}
	wg.Wait()
	for i, rep := range reps {
		if rep.Failover == nil || len(rep.Failover.Lost) != 1 || rep.Verdict != lab.Breaks {
			t.Errorf("namespace %d: verdict %q, evidence %+v: %s", i, rep.Verdict, rep.Failover, rep.Reason)
		}
	}
}

// TestPGFailoverRefusesWhatItCannotFail: a design with no key in
// PostgreSQL, or an unknown replication, is refused before anything runs.
func TestPGFailoverRefusesWhatItCannotFail(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.EffectsConfig(t))
	for query, param := range map[string]string{
		"store=memory&fault=pg_failover":                    "fault",
		"store=postgres&fault=pg_failover&replication=raft": "replication",
		"store=postgres&fault=slow&replication=sync":        "replication",
	} {
		labtest.WantProblem(t, query, labtest.Do(t, http.MethodGet, a.URL()+"/charge-idempotent?"+query, nil, ""),
			http.StatusBadRequest, "invalid_parameter", param)
	}
}
