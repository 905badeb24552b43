// Package reconcile compares the ledger with the payment provider's own
// records, charge by charge: each charge should be captured exactly once,
// for its amount, and reach the capture's state through a verified webhook.
package reconcile

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/provider"
)

// Reconciliation findings: how a charge's ledger state and the provider's
// records disagree.
const (
	CapturedTwice   = "captured_twice"     // more than one capture for one charge
	NotInLedger     = "not_in_ledger"      // captured, but the ledger holds no such charge (sent, then rolled back)
	NeverCaptured   = "never_captured"     // charged, its effects delivered or given up, and no capture
	AmountMismatch  = "amount_mismatch"    // captured for another amount
	StateMismatch   = "state_mismatch"     // the ledger's payment state contradicts the capture
	AwaitingWebhook = "awaiting_webhook"   // captured, the charge still pending: no verified webhook yet
	InFlight        = "delivery_in_flight" // the outbox has not delivered it yet
	WebhookMismatch = "webhook_mismatch"   // a verified webhook did not match it (amount, currency, capture): recorded, moved nothing
	Stuck           = "stuck"              // captured longer ago than the bound, the charge still pending: its webhook is not coming
)

// Bounds say when a captured charge still pending stops settling and is
// stuck: StuckAfter past its capture, at Now. A zero StuckAfter judges no
// charge stuck.
type Bounds struct {
	Now        time.Time
	StuckAfter time.Duration
}

// Finding is one charge on which the ledger and the provider disagree.
type Finding struct {
	ChargeID string             `json:"charge_id"`
	Problem  string             `json:"problem"`
	Detail   string             `json:"detail"`
	Ledger   *lab.Payment       `json:"ledger"`
	Provider []provider.Capture `json:"provider_captures"`
}

// Report is one comparison.
type Report struct {
	Namespace       string `json:"namespace"`
	Run             string `json:"run,omitempty"`
	ChargesChecked  int    `json:"charges_checked"`
	CapturesChecked int    `json:"captures_checked"`
	Agree           int    `json:"agree"`
	Disagree        int    `json:"disagree"`
	Pending         int    `json:"pending"` // not yet settled: deliveries in flight, webhooks not yet in
	// Unchecked are charges older than the oldest capture read, when the
	// captures were cut at their limit: their capture may lie beyond it.
	Unchecked int       `json:"unchecked,omitempty"`
	Findings  []Finding `json:"findings"`
	Note      string    `json:"note"`
}

// Compare compares the two sides, judging no charge stuck. When the
// ledger's list was cut at its limit, captures older than its oldest charge
// are not judged; when the captures were, charges older than the oldest
// capture without one in the list are not judged either.
func Compare(payments []lab.Payment, captures []provider.Capture, paymentsCut, capturesCut bool) Report {
	return CompareWithin(payments, captures, paymentsCut, capturesCut, Bounds{})
}

// CompareWithin compares as Compare does, and reports a captured charge
// still pending after b.StuckAfter as stuck, a disagreement, rather than
// as still settling.
func CompareWithin(payments []lab.Payment, captures []provider.Capture, paymentsCut, capturesCut bool, b Bounds) Report {
	rep := Report{ChargesChecked: len(payments), CapturesChecked: len(captures), Findings: []Finding{},
		Note: "each charge should be captured exactly once, for its amount, and reach the capture's state through a verified webhook"}
	byCharge := map[string][]provider.Capture{}
	var oldestCapture time.Time
	for _, cp := range captures {
		byCharge[cp.ChargeID] = append(byCharge[cp.ChargeID], cp)
		if oldestCapture.IsZero() || cp.CreatedAt.Before(oldestCapture) {
			oldestCapture = cp.CreatedAt
		}
	}
	var oldest time.Time
	inLedger := map[string]bool{}
	for i := range payments {
		p := &payments[i]
		inLedger[p.ChargeID] = true
		if oldest.IsZero() || p.CreatedAt.Before(oldest) {
			oldest = p.CreatedAt
		}
		caps := byCharge[p.ChargeID]
		if len(caps) == 0 && capturesCut && p.CreatedAt.Before(oldestCapture) {
			rep.Unchecked++
			continue
		}
		f := Finding{ChargeID: p.ChargeID, Ledger: p, Provider: caps}
		settled := p.Outbox == lab.EventDelivered || p.Outbox == lab.EventDead || p.Outbox == ""
		switch {
		case len(caps) > 1:
			f.Problem, f.Detail = CapturedTwice, fmt.Sprintf("the provider captured this charge %d times", len(caps))
		case p.Mismatched > 0:
			f.Problem = WebhookMismatch
			f.Detail = fmt.Sprintf("%d verified webhook(s) did not match the charge and moved nothing; the latest: %s", p.Mismatched, p.Mismatch)
		case len(caps) == 0 && !settled:
			f.Problem, f.Detail = InFlight, "the relay has not delivered its capture yet"
		case len(caps) == 0:
			f.Problem, f.Detail = NeverCaptured, "charged in the ledger; the provider never received its capture"
		case caps[0].AmountCents != p.AmountCents || caps[0].Currency != p.Currency:
			f.Problem = AmountMismatch
			f.Detail = fmt.Sprintf("ledger %d %s, provider %d %s", p.AmountCents, p.Currency, caps[0].AmountCents, caps[0].Currency)
		case p.State == lab.PaymentPending && b.StuckAfter > 0 && b.Now.Sub(caps[0].CreatedAt) > b.StuckAfter:
			f.Problem = Stuck
			f.Detail = fmt.Sprintf("captured (%s) %s ago, more than %s, and still pending: no verified webhook has moved it; "+
				"see the provider's dead webhooks", caps[0].Status, b.Now.Sub(caps[0].CreatedAt).Round(time.Second), b.StuckAfter)
		case p.State == lab.PaymentPending:
			f.Problem, f.Detail = AwaitingWebhook, "captured ("+caps[0].Status+"); no verified webhook has moved the charge yet"
		case p.State != caps[0].Status:
			f.Problem, f.Detail = StateMismatch, "ledger "+p.State+", provider "+caps[0].Status
		default:
			rep.Agree++
			continue
		}
		if f.Problem == InFlight || f.Problem == AwaitingWebhook {
			rep.Pending++
		} else {
			rep.Disagree++
		}
		rep.Findings = append(rep.Findings, f)
	}
	for chargeID, caps := range byCharge {
		if inLedger[chargeID] || (paymentsCut && caps[0].CreatedAt.Before(oldest)) {
			continue
		}
		rep.Disagree++
		rep.Findings = append(rep.Findings, Finding{ChargeID: chargeID, Problem: NotInLedger, Provider: caps,
			Detail: "the provider captured a charge the ledger does not hold: sent before a transaction that rolled back"})
	}
	slices.SortFunc(rep.Findings, func(a, b Finding) int { return strings.Compare(a.ChargeID, b.ChargeID) })
	return rep
}
