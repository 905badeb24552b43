package labsvc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/history"
	"github.com/idempotency-lab/lab/lab/step"
)

// ScenarioStepped names a stepped run in the run history.
const ScenarioStepped experiment.Scenario = "stepped"

// over records a finished stepped run as a run like any other: its
// history (one charge per attempt, from its sending to its answer, and the
// ledger's reads of the key around them) checked, its figures read from
// the books, kept in the namespace's history.
func (st *stepped) over(ctx context.Context, v step.View) step.Verdict {
	// A failover run is never left held; a hold a failed promote leaves
	// ends at the pair's hold deadline.
	_ = st.promote(ctx)
	key := history.Key{Tenant: st.id.Tenant, Endpoint: string(v.Store), Key: v.Key}
	tally, err := st.s.StepCharges(ctx, st.id.Tenant, v)
	if err != nil {
		return step.Verdict{RunID: v.ID, Checked: string(history.Unknown),
			CheckedWhy: fmt.Sprintf("the ledger could not be read: %v", err)}
	}
	end := time.Since(st.run.Started())
	us := func(ms *float64) int64 {
		if ms == nil {
			return end.Microseconds()
		}
		return int64(*ms * 1000)
	}
	// Nothing charged under the run's key before its first move: the key
	// is the run's own (its id).
	h := history.History{Run: v.ID, Ops: []history.Op{{Kind: history.LedgerRead, Before: true, Key: key}}}
	rep := experiment.Report{RunID: v.ID, Store: v.Store, Variant: "idempotent", Scenario: ScenarioStepped,
		Key: v.Key, Account: DefaultAccount, Namespace: st.id.Namespace, Tenant: st.id.Tenant, Attempts: len(v.Attempts),
		Replicas: len(st.targets()), AmountCents: DefaultAmount, ExpectedCharges: 1, ChargesApplied: tally.Charges,
		KeyCharges: tally.Charges, DuplicatesApplied: max(tally.Charges-1, 0), RunChargedCents: tally.Cents,
		StartedAt: st.run.Started().UTC(), WallMS: float64(end.Microseconds()) / 1000,
		Note: "stepped run, schedule " + step.FormatMoves(v.Steps)}
	if v.Store == "unsafe" {
		rep.Variant = "unsafe"
	}
	rep.Verdict = lab.Holds
	if tally.Charges > 1 {
		rep.Verdict = lab.Breaks
	}
	rep.Fault = st.req.Faults.Point
	if st.onPG() { // a charge a client was told of, gone from the surviving books, is the break
		for _, a := range v.Attempts {
			if id := answerCharge(a.Answer); id != "" && !slices.Contains(tally.IDs, id) && !slices.Contains(rep.LostAcknowledged, id) {
				rep.LostAcknowledged = append(rep.LostAcknowledged, id)
			}
		}
		if len(rep.LostAcknowledged) > 0 {
			rep.Verdict = lab.Breaks
			rep.Note += "; lost in the failover, answered to a client: " + strings.Join(rep.LostAcknowledged, ", ")
		}
	}
	for _, a := range v.Attempts {
		ans := a.Answer
		if ans == nil {
			ans = &step.Answer{Error: "no answer"}
		}
		call, ret := us(a.SentMS), us(a.AnswerMS)
		h.Ops = append(h.Ops, history.Op{Kind: history.Charge, Client: a.Attempt, CallUS: call, ReturnUS: ret, Key: key,
			Fingerprint: fmt.Sprintf("%s %d %s", DefaultAccount, DefaultAmount, lab.DefaultCurrency),
			Status:      ans.Status, ChargeID: ans.ChargeID, Replayed: ans.Replayed, Code: ans.Code})
		if ans.Replayed {
			rep.IdempotencyHits++
		}
		rep.Timeline = append(rep.Timeline, experiment.Result{Attempt: a.Attempt, Target: a.Target, Replica: ans.Replica,
			Tries: []experiment.Try{{Status: ans.Status, Replica: ans.Replica, Replayed: ans.Replayed, Code: ans.Code,
				Error: ans.Error, StartMS: float64(call) / 1000, LatencyMS: float64(ret-call) / 1000}}})
	}
	h.Ops = append(h.Ops, history.Op{Kind: history.LedgerRead, CallUS: end.Microseconds(), ReturnUS: end.Microseconds(),
		Key: key, Charges: tally.IDs})
	for _, m := range v.Moves {
		if m.Move.Event != "" {
			e := experiment.Event{Name: string(m.Move.Event), AtMS: m.AtMS, Detail: m.Did}
			rep.Events = append(rep.Events, e)
			h.Events = append(h.Events, history.Event{Name: e.Name, AtUS: int64(e.AtMS * 1000), Detail: e.Detail})
		}
	}
	if rep.Events == nil {
		rep.Events = []experiment.Event{}
	}
	res := history.Check(h, history.DefaultTimeout)
	rep.History, rep.Checked, rep.CheckedWhy, rep.CheckedOps, rep.CheckMS = h, res.Verdict, res.Why, res.Ops,
		float64(res.Took.Microseconds())/1000
	st.s.remember(rep)
	return step.Verdict{RunID: v.ID, Checked: string(res.Verdict), CheckedWhy: res.Why}
}

// answerCharge is the charge an answer named, "" for none.
func answerCharge(a *step.Answer) string {
	if a == nil {
		return ""
	}
	return a.ChargeID
}
