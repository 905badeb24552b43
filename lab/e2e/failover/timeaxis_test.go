package failover_test

import (
	"bytes"
	"net/http"
	"regexp"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/lease"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
)

// eventOf finds the first event of name (for attempt, when > 0).
func eventOf(rep experiment.Report, name string, attempt int) (experiment.Event, bool) {
	for _, e := range rep.Events {
		if e.Name == name && (attempt == 0 || e.Attempt == attempt) {
			return e, true
		}
	}
	return experiment.Event{}, false
}

// TestTwoPhaseRunsShareOneTimeAxis: a stale worker's retries are drawn
// after its claim ran out, as they happened, not from a clock of their own;
// on lease the paused worker's refused write is a phase of its own, with
// both tokens.
func TestTwoPhaseRunsShareOneTimeAxis(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.FullConfig(t))
	for _, store := range []lab.StoreName{redis.Name, lease.Name} {
		t.Run(string(store), func(t *testing.T) {
			rep := e2e.RunOvertaken(t, a.URL(), store, "attempts=3")
			ttlEnd, ok := eventOf(rep, experiment.EventTTLEnd, 1)
			if !ok {
				t.Fatalf("no ttl_end event for attempt 1: %+v", rep.Events)
			}
			released, ok := eventOf(rep, experiment.EventRetriesReleased, 0)
			if !ok || released.AtMS < ttlEnd.AtMS {
				t.Fatalf("retries released at %+v, the claim ran out at %.1f ms", released, ttlEnd.AtMS)
			}
			pauseEnd, ok := eventOf(rep, experiment.EventPauseEnd, 1)
			if pause := float64(lab.FaultDefault(lab.FaultStaleWorker, "work_ms")); !ok || pauseEnd.AtMS < pause {
				t.Fatalf("the pause ended at %+v, want after its %.0f ms", pauseEnd, pause)
			}
			for _, res := range rep.Timeline[1:] {
				if first := res.Tries[0]; first.StartMS < ttlEnd.AtMS {
					t.Errorf("attempt %d's first try starts at %.1f ms, inside the claim's TTL (ends %.1f ms)", res.Attempt, first.StartMS, ttlEnd.AtMS)
				}
			}
			if rep.WallMS < pauseEnd.AtMS {
				t.Errorf("wall %.1f ms ends before the pause's end at %.1f ms", rep.WallMS, pauseEnd.AtMS)
			}
			var fenced *lab.PhaseAt
			for _, p := range rep.Timeline[0].Final().Phases {
				if p.Name == lab.PhaseFenced {
					fenced = &p
				}
			}
			switch store {
			case lease.Name:
				if fenced == nil || !regexp.MustCompile(`^write refused: token \d+ < \d+$`).MatchString(fenced.Detail) || fenced.AtMS < pauseEnd.AtMS {
					t.Fatalf("the paused worker's phases %+v: want a fenced phase after its pause, with both tokens", rep.Timeline[0].Final().Phases)
				}
				if _, ok := eventOf(rep, experiment.EventFenced, 1); !ok || rep.FencedWrites != 1 {
					t.Fatalf("fenced writes %d, events %+v", rep.FencedWrites, rep.Events)
				}
			case redis.Name:
				if fenced != nil {
					t.Fatalf("redis has no fence, yet a fenced phase: %+v", fenced)
				}
			}
		})
	}
	t.Run("expired", func(t *testing.T) {
		rep := e2e.Run(t, a.URL(), postgres.Name, "fault=expired&window_ms=200&key=fresh&attempts=3")
		expired, ok := eventOf(rep, experiment.EventWindowExpired, 0)
		first := rep.Timeline[0].Final()
		if !ok || expired.AtMS < first.StartMS+first.LatencyMS+200 {
			t.Fatalf("window expired at %+v; the first answer came at %.1f ms", expired, first.StartMS+first.LatencyMS)
		}
		for _, res := range rep.Timeline[1:] {
			if res.Tries[0].StartMS < expired.AtMS {
				t.Errorf("attempt %d starts at %.1f ms, before the window's end at %.1f ms", res.Attempt, res.Tries[0].StartMS, expired.AtMS)
			}
		}
	})
}

// TestLiveLeaseWorkerKeepsItsLease: work three times longer than its lease
// is renewed, not taken over: five attempts, one charge, no fenced write,
// and every twin's client follows its 202 to the operation's final answer.
func TestLiveLeaseWorkerKeepsItsLease(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, postgres.Name))
	rep := e2e.Run(t, a.URL(), lease.Name, "fault=slow&work_ms=3000&ttl_ms=1000&attempts=5&key=fresh")
	if rep.Verdict != lab.Holds || rep.ChargesApplied != 1 || rep.FencedWrites != 0 {
		t.Fatalf("verdict %s, %d charges, %d fenced: %s", rep.Verdict, rep.ChargesApplied, rep.FencedWrites, rep.Explanation)
	}
	if n := e2e.KeyCharges(t, a, rep.Tenant, lease.Name, rep.Key); n != 1 {
		t.Fatalf("the ledger holds %d charges for the key", n)
	}
	renewals, polled := 0, 0
	for _, res := range rep.Timeline {
		f := res.Final()
		if f.Status != http.StatusCreated {
			t.Errorf("attempt %d ends with %d %s: want every attempt's final answer", res.Attempt, f.Status, f.Code)
		}
		for _, try := range res.Tries {
			for _, p := range try.Phases {
				if p.Name == lab.PhaseRenew {
					renewals++
				}
			}
			if try.Poll {
				polled++
			}
		}
		if len(res.Tries) > 1 && (res.Tries[0].Status != http.StatusAccepted || !f.Poll || !f.Replayed) {
			t.Errorf("attempt %d's tries %+v: want 202, then polls to the replayed answer", res.Attempt, res.Tries)
		}
	}
	if renewals < 3 || polled == 0 {
		t.Fatalf("%d renewals, %d polls: want the lease renewed while working and the twins polling", renewals, polled)
	}
}

// TestBodiesEndWithANewline: every JSON answer, stored, replayed or a
// problem, ends with a newline (a shell prompt never sticks to it), and the
// replay is still byte for byte the first answer.
func TestBodiesEndWithANewline(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.StoreConfig(t, postgres.Name))
	h := http.Header{"Authorization": {"Bearer demo-token-acme"}, "Idempotency-Key": {"nl-1"}}
	for _, store := range []lab.StoreName{memory.Name, postgres.Name, lease.Name} {
		u := a.URL() + "/charges?store=" + string(store)
		first := labtest.Do(t, http.MethodPost, u, h, `{"account":"acct-1","amount_cents":100}`)
		replay := labtest.Do(t, http.MethodPost, u, h, `{"account":"acct-1","amount_cents":100}`)
		reused := labtest.Do(t, http.MethodPost, u, h, `{"account":"acct-1","amount_cents":999}`)
		if first.Status != http.StatusCreated || !bytes.Equal(first.Body, replay.Body) || reused.Status != http.StatusUnprocessableEntity {
			t.Fatalf("%s: %d, replay equal %v, reused %d", store, first.Status, bytes.Equal(first.Body, replay.Body), reused.Status)
		}
		for name, r := range map[string]labtest.Reply{"201": first, "replay": replay, "422": reused} {
			if !bytes.HasSuffix(r.Body, []byte("}\n")) {
				t.Errorf("%s %s: body ends %q", store, name, r.Body[max(0, len(r.Body)-8):])
			}
		}
	}
	for _, path := range []string{"/charge-idempotent?amount=abc", "/health", "/idempotency/state", "/lab/runs"} {
		if r := labtest.Do(t, http.MethodGet, a.URL()+path, nil, ""); !bytes.HasSuffix(r.Body, []byte("\n")) {
			t.Errorf("%s: %d body ends %q", path, r.Status, r.Body[max(0, len(r.Body)-8):])
		}
	}
}
