package experiment

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/history"
)

// The proof of a run, beside its verdict: the verdict counts the ledger;
// the proof asks whether every answer a client got is one a single, atomic
// "charge once per key" could have given, with the ledger's reads of the key
// before and after the run as operations too (a key charged twice may
// answer every retry with the same charge: only the ledger read sees it).
// And the money: every account the run touched holds, in one snapshot, a
// balance equal to the sum of its ledger rows, and the run's own rows sum
// to what its answers charged.

// MoneyCheck is the money invariant of a run (Jepsen's bank test).
type MoneyCheck struct {
	Holds bool   `json:"holds"`
	Why   string `json:"why"`
	// Accounts are the (tenant, account) pairs read, each in one snapshot.
	Accounts int `json:"accounts"`
}

// ledgerRead is one read of the run's key in the ledger, per tenant, with
// when it was called and returned.
type ledgerRead struct {
	tally      keyTally
	call, done time.Time
}

func (r *Runner) readLedger(ctx context.Context, spec Spec, tenants []string) (ledgerRead, error) {
	call := time.Now()
	t, err := r.tally(ctx, spec, tenants)
	return ledgerRead{tally: t, call: call, done: time.Now()}, err
}

// attemptTenant is the tenant attempt i (from 0) charges as.
func attemptTenant(spec Spec, i int) string {
	if spec.Scenario == ScenarioTenants && i%2 == 1 {
		return spec.OtherTenant
	}
	return spec.Tenant
}

// attemptAmount is what attempt i (from 0) asks to charge.
func attemptAmount(spec Spec, i int) int64 {
	if spec.Scenario == ScenarioReused && i > 0 {
		return spec.AmountCents + 1
	}
	return spec.AmountCents
}

// fingerprint names the request attempt i sends: two attempts with the same
// fingerprint send the same charge.
func fingerprint(spec Spec, i int) string {
	fp := fmt.Sprintf("%s %d %s", spec.Account, attemptAmount(spec, i), lab.DefaultCurrency)
	if spec.OrderID != "" {
		fp += " order " + spec.OrderID
	}
	return fp
}

// recordHistory turns the run's tries, its ledger reads and its events
// into its history, every time on the run's axis (µs from its release).
func recordHistory(spec Spec, rep *Report, tenants []string, before, after ledgerRead, origin time.Time) history.History {
	h := history.History{Run: rep.RunID}
	us := func(t time.Time) int64 { return t.Sub(origin).Microseconds() }
	key := func(tenant string) history.Key {
		return history.Key{Tenant: tenant, Endpoint: string(spec.Store), Key: spec.Key}
	}
	for i, tenant := range tenants {
		h.Ops = append(h.Ops, history.Op{Kind: history.LedgerRead, Before: true, CallUS: us(before.call), ReturnUS: us(before.done),
			Key: key(tenant), Charges: before.tally[i].IDs})
	}
	for _, res := range rep.Timeline {
		i := res.Attempt - 1
		for _, t := range res.Tries {
			call := int64(t.StartMS * 1000)
			h.Ops = append(h.Ops, history.Op{Kind: history.Charge, Client: res.Attempt, CallUS: call,
				ReturnUS: call + int64(t.LatencyMS*1000), Key: key(attemptTenant(spec, i)), Fingerprint: fingerprint(spec, i),
				Status: t.Status, ChargeID: answeredCharge(t).ID, Replayed: t.Replayed, Code: t.Code})
		}
	}
	for i, tenant := range tenants {
		h.Ops = append(h.Ops, history.Op{Kind: history.LedgerRead, CallUS: us(after.call), ReturnUS: us(after.done),
			Key: key(tenant), Charges: after.tally[i].IDs})
	}
	for _, e := range rep.Events {
		h.Events = append(h.Events, history.Event{Name: e.Name, AtUS: int64(e.AtMS * 1000), Client: e.Attempt, Detail: e.Detail})
	}
	return h
}

// answeredCharge is the charge a 2xx try's body names, if any.
func answeredCharge(t Try) lab.Charge {
	var c lab.Charge
	if t.Status >= 200 && t.Status < 300 && t.Status != 202 {
		_ = json.Unmarshal(t.Body, &c) // a body that is no charge names none
	}
	return c
}

// prove checks the run's history and its money, after its figures are in.
func (r *Runner) prove(ctx context.Context, spec Spec, tenants []string, before ledgerRead, origin time.Time, rep *Report) error {
	after, err := r.readLedger(ctx, spec, tenants)
	if err != nil {
		return err
	}
	rep.History = recordHistory(spec, rep, tenants, before, after, origin)
	res := history.Check(rep.History, history.DefaultTimeout)
	rep.Checked, rep.CheckedWhy, rep.CheckedOps, rep.CheckMS = res.Verdict, res.Why, res.Ops, ms(res.Took)
	rep.Money, err = r.money(ctx, spec, tenants, before, rep)
	return err
}

// money holds the run to the bank invariant.
func (r *Runner) money(ctx context.Context, spec Spec, tenants []string, before ledgerRead, rep *Report) (MoneyCheck, error) {
	mc := MoneyCheck{Holds: true}
	books, err := r.books(ctx, spec)
	if err != nil {
		return mc, err
	}
	var broken []string
	for _, tenant := range tenants {
		var m lab.AccountMoney
		err := reread(ctx, func() (err error) { m, err = books.AccountMoney(ctx, tenant, spec.Account); return err })
		if err != nil {
			return mc, fmt.Errorf("error reading the account's money: %w", err)
		}
		mc.Accounts++
		if m.BalanceCents != m.RowsCents {
			broken = append(broken, fmt.Sprintf("account %s of %s has a balance of %d cents but its %d ledger rows sum to %d",
				spec.Account, tenant, m.BalanceCents, m.Rows, m.RowsCents))
		}
	}
	// What the answers charged: each charge they name once, but not those
	// the key held before the run (a replay of an old charge is no charge).
	var old []string
	for _, t := range before.tally {
		old = append(old, t.IDs...)
	}
	seen := map[string]bool{}
	var answered, unknownMax int64
	for _, res := range rep.Timeline {
		for _, t := range res.Tries {
			c := answeredCharge(t)
			switch {
			case c.ID != "" && !seen[c.ID] && !slices.Contains(old, c.ID):
				seen[c.ID] = true
				answered += c.AmountCents
			case t.Status == 0 || t.Status >= 500 || t.Status == 202:
				// No answer said what happened: it may have charged.
				unknownMax += attemptAmount(spec, res.Attempt-1)
			}
		}
	}
	switch got := rep.RunChargedCents; {
	case got < answered:
		broken = append(broken, fmt.Sprintf("the answers charged %d cents, but the run's ledger rows sum to %d", answered, got))
	case got > answered+unknownMax:
		broken = append(broken, fmt.Sprintf("the run's ledger rows sum to %d cents, but its answers charged %d (and the tries that got no answer at most %d more)",
			got, answered, unknownMax))
	}
	if len(broken) > 0 {
		mc.Holds, mc.Why = false, strings.Join(broken, "; ")
		return mc, nil
	}
	mc.Why = fmt.Sprintf("every balance equals the sum of its ledger rows, and the run's rows (%d cents) are what its answers charged", rep.RunChargedCents)
	if unknownMax > 0 && rep.RunChargedCents > answered {
		mc.Why = fmt.Sprintf("every balance equals the sum of its ledger rows; the run's rows (%d cents) are what its answers charged (%d) and what tries whose answer never came charged", rep.RunChargedCents, answered)
	}
	return mc, nil
}
