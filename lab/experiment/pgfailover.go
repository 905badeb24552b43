package experiment

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// PGFailover is the lab's PostgreSQL primary and standby, which the
// pg_failover runs (and only they) charge on and fail over, one namespace's
// run at a time.
type PGFailover interface {
	// Books are the pair's ledger and outbox, on its primary of the moment;
	// the pair starts on first use.
	Books(ctx context.Context) (GroundTruth, error)
	// Hold stops the standby receiving WAL, replicating in mode: what the
	// primary commits next is on the primary alone. Another namespace's
	// failover under way is lab.ErrFailoverUnderWay.
	Hold(ctx context.Context, ns lab.Namespace, mode lab.Replication) error
	// Promote makes the standby the primary, after the old primary's relay
	// delivered what it had; with answered non-nil, once a commit waits for
	// the standby or answered is closed (a replay commits nothing).
	Promote(ctx context.Context, ns lab.Namespace, answered <-chan struct{}) error
	// Settle delivers the new primary's outbox, reads the run's charges on
	// both servers, then discards the old primary and makes a new standby.
	Settle(ctx context.Context, ns lab.Namespace, run string) (FailoverEvidence, error)
}

// FailoverEvidence is what a PostgreSQL failover left on each server, read
// before the old primary was discarded.
type FailoverEvidence struct {
	Replication lab.Replication `json:"replication"`
	// OldPrimary and NewPrimary are the run's charges each server holds.
	OldPrimary []lab.Payment `json:"old_primary_charges"`
	NewPrimary []lab.Payment `json:"new_primary_charges"`
	// Lost are the charges the old primary committed that the promoted
	// standby never received.
	Lost []string `json:"lost_charges"`
	// CommitWaited: a commit was waiting for the synchronous standby when
	// the standby was promoted.
	CommitWaited bool `json:"commit_waited"`
}

// LostCharges lists the old primary's charges the new one lacks.
func LostCharges(old, surviving []lab.Payment) []string {
	var lost []string
	for _, p := range old {
		if !slices.ContainsFunc(surviving, func(s lab.Payment) bool { return s.ChargeID == p.ChargeID }) {
			lost = append(lost, p.ChargeID)
		}
	}
	return lost
}

// pgFailoverQueue bounds how long a run waits for another namespace's
// PostgreSQL failover to end: a whole run, retries and rebuild included.
const pgFailoverQueue = 45 * time.Second

// books is where a run's charges are judged: the pair's, for a run whose
// attempts charge on it.
func (r *Runner) books(ctx context.Context, spec Spec) (GroundTruth, error) {
	if spec.Faults.Replication == "" {
		return r.Books, nil
	}
	if r.PGFailover == nil {
		return nil, fmt.Errorf("%w: this lab has no PostgreSQL pair", lab.ErrStoreUnavailable)
	}
	return r.PGFailover.Books(ctx)
}

// firePGFailover holds the pair's standby back, sends the first attempt,
// promotes the standby and sends the retries, which reach the new primary.
// Asynchronous, the first attempt is acknowledged before the promotion;
// synchronous, its commit waits for the standby, the standby is promoted
// meanwhile, and its client hangs up without an answer.
func (r *Runner) firePGFailover(ctx context.Context, spec Spec, run string, reqs []Request, rep *Report, ev *events) ([]Result, time.Duration, error) {
	pf, ns := r.PGFailover, spec.Namespace
	err := pf.Hold(ctx, ns, spec.Faults.Replication)
	for wait := time.Now().Add(pgFailoverQueue); errors.Is(err, lab.ErrFailoverUnderWay) && time.Now().Before(wait); {
		if serr := lab.Sleep(ctx, 200*time.Millisecond); serr != nil {
			return nil, 0, serr
		}
		err = pf.Hold(ctx, ns, spec.Faults.Replication)
	}
	if err != nil {
		return nil, 0, err
	}
	settled := false
	defer func() {
		if !settled { // the pair must not stay held or half failed over
			_, _ = pf.Settle(context.WithoutCancel(ctx), ns, run)
		}
	}()
	ev.add(EventFailoverHold, 0, "the standby receives no WAL: what the primary commits now is on the primary alone")
	sync := spec.Faults.Replication == lab.ReplicationSync
	firstCtx, hangUp := context.WithCancel(ctx)
	defer hangUp()
	answered, done := make(chan []Result, 1), make(chan struct{})
	go func() {
		res, _ := Fire(firstCtx, r.Client, reqs[:1], Retry{})
		answered <- res
		close(done)
	}()
	var first []Result
	var wait <-chan struct{}
	if sync {
		wait = done
	} else {
		first = <-answered
	}
	err = pf.Promote(context.WithoutCancel(ctx), ns, wait)
	if sync {
		hangUp() // its commit still waits for a standby that is gone: the client gives up
		first = <-answered
	}
	if err != nil {
		return nil, 0, err
	}
	ev.add(EventFailoverPromote, 0, "the standby is the primary now: what only the old primary committed is not on it")
	rest, spread := r.fireRetries(ctx, spec, reqs[1:], ev)
	evidence, err := pf.Settle(context.WithoutCancel(ctx), ns, run)
	settled = true
	if err != nil {
		return nil, 0, err
	}
	rep.Failover = &evidence
	return append(first, rest...), spread, nil
}

// judgeFailover says what a PostgreSQL failover lost of what the clients
// were told, and judges the run by it: a charge the client holds an answer
// for, gone from the surviving books, is a break whatever the new primary's
// ledger shows. Otherwise the ledger's verdict and explanation stand.
func (r *Runner) judgeFailover(spec Spec, rep *Report) {
	f := rep.Failover
	if f == nil {
		return
	}
	told := map[string]bool{}
	for _, res := range rep.Timeline {
		if c := answeredCharge(res.Final()); c.ID != "" {
			told[c.ID] = true
		}
	}
	var lostTold []string
	for _, id := range f.Lost {
		if told[id] {
			lostTold = append(lostTold, id)
		}
	}
	rep.LostAcknowledged = lostTold
	surviving := chargeIDs(f.NewPrimary)
	switch {
	case len(lostTold) > 0:
		rep.Verdict = lab.Breaks
		again := "the retry charged " + orNone(surviving) + " again"
		if len(surviving) == 0 {
			again = "the retries were answered with it again"
		}
		rep.Reason = fmt.Sprintf("the old primary committed %s and answered 201; the promoted standby never received it; %s: the client was told of %d charge(s), the surviving books hold %d, the provider captured %d",
			strings.Join(lostTold, ", "), again, len(told), len(f.NewPrimary), rep.ProviderCaptures)
		rep.Explanation = r.explain(spec, rep.Replicas, rep.Verdict)
	case f.CommitWaited:
		kept := ""
		if len(f.Lost) > 0 {
			kept = " (the old primary's local commit of " + strings.Join(f.Lost, ", ") + " went with it)"
		}
		rep.Reason = fmt.Sprintf("the first attempt's commit waited for the standby and never returned: its client saw no answer; the retry charged %s on the new primary; nothing acknowledged was lost%s",
			orNone(surviving), kept)
	default:
		rep.Reason = fmt.Sprintf("the old primary held %s, the promoted standby %s: nothing a client was told of was lost",
			orNone(chargeIDs(f.OldPrimary)), orNone(surviving))
	}
}

func chargeIDs(ps []lab.Payment) []string {
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = p.ChargeID
	}
	return ids
}

func orNone(ids []string) string {
	if len(ids) == 0 {
		return "no charge"
	}
	return strings.Join(ids, ", ")
}
