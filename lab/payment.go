package lab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Payment states of a charge: the provider's verdict, which only a verified
// webhook may bring. A charge starts pending.
const (
	PaymentPending   = "pending"
	PaymentSucceeded = "succeeded"
	PaymentFailed    = "failed"
)

// Webhook event types the provider sends about a capture.
const (
	WebhookCaptureProcessing = "capture.processing"
	WebhookCaptureSucceeded  = "capture.succeeded"
	WebhookCaptureFailed     = "capture.failed"
)

// ErrUnknownWebhookType is a webhook whose type the state machine does not
// know; ErrUnknownCharge one about a charge the ledger does not hold (yet:
// the provider retries it); ErrCaptureNotRecorded one that would move a
// charge of which the lab has recorded no capture (yet: the provider
// retries it, and it moves the charge only if the relay then records that
// very capture).
var (
	ErrUnknownWebhookType = errors.New("unknown webhook event type")
	ErrUnknownCharge      = errors.New("the webhook names a charge the ledger does not hold")
	ErrCaptureNotRecorded = errors.New("the webhook names a capture the lab has not recorded for its charge")
)

// NextPaymentState is the state machine a webhook drives: pending moves to
// succeeded or failed; a final state never moves again, so a late or
// duplicated event changes nothing and failed never becomes succeeded.
func NextPaymentState(current, eventType string) (string, error) {
	var target string
	switch eventType {
	case WebhookCaptureProcessing:
		target = PaymentPending
	case WebhookCaptureSucceeded:
		target = PaymentSucceeded
	case WebhookCaptureFailed:
		target = PaymentFailed
	default:
		return current, fmt.Errorf("%w: %q", ErrUnknownWebhookType, eventType)
	}
	switch current {
	case PaymentPending:
		return target, nil
	case PaymentSucceeded, PaymentFailed:
		return current, nil
	}
	return current, fmt.Errorf("unknown payment state %q", current)
}

// Webhook is one verified provider event about a charge.
type Webhook struct {
	EventID    string
	Type       string
	ChargeID   string
	Tenant     string
	ReceivedAt time.Time
	// The capture the event is about, as the provider tells it, and the
	// idempotency key of the call that made it.
	CaptureID   string
	CaptureKey  string
	AmountCents int64
	Currency    string
}

// OwnCapture reports whether w's capture was made under the key the relay
// derives from its charge: the lab's own capture call, whose answer may
// still be on its way to the relay. The provider signs the webhook, key
// included, so it is as good as that answer.
func (w Webhook) OwnCapture() bool {
	return w.CaptureKey != "" && w.CaptureKey == DerivedCaptureKey(w.ChargeID)
}

// RecordsCapture reports whether applying w, matched, records its capture:
// the lab has recorded none of the charge yet, and w's is its own.
func (w Webhook) RecordsCapture(c ChargeTerms) bool { return len(c.Captures) == 0 && w.OwnCapture() }

// WebhookResult is what processing a webhook did.
type WebhookResult struct {
	// Duplicate: the event id was processed before; nothing changed.
	Duplicate bool `json:"duplicate"`
	// Before and After are the charge's payment state around the event.
	Before string `json:"state_before,omitempty"`
	After  string `json:"state_after,omitempty"`
	// Mismatch says why the event did not match its charge (amount,
	// currency or capture): it was recorded and moved nothing.
	Mismatch string `json:"mismatch,omitempty"`
}

// ChargeTerms are what a webhook must agree with to move a charge: the
// ledger's amount and currency, and the captures the lab recorded of it.
type ChargeTerms struct {
	State       string
	AmountCents int64
	Currency    string
	Captures    []string // capture ids, as the provider answered the lab's own capture calls
}

// MatchWebhook decides whether w is about the charge as the ledger holds
// it. It returns "" when w may drive the state machine, or why not: the
// amount or currency differ, or its capture is not one the lab recorded
// (the charge has others). When the lab has recorded no capture of the
// charge yet, w's own key says whether it is the relay's capture (then it
// matches, and is recorded with it: RecordsCapture); without that key and
// when w would move the charge, it returns ErrCaptureNotRecorded: the
// capture may be the relay's, whose answer is still on its way, or one the
// relay never made; either way the charge stays as it is.
func MatchWebhook(w Webhook, c ChargeTerms) (string, error) {
	if w.AmountCents != c.AmountCents || w.Currency != c.Currency {
		return fmt.Sprintf("the webhook is for %d %s; the charge is %d %s", w.AmountCents, w.Currency, c.AmountCents, c.Currency), nil
	}
	if slices.Contains(c.Captures, w.CaptureID) {
		return "", nil
	}
	if len(c.Captures) > 0 {
		return fmt.Sprintf("capture %q is not the lab's capture of this charge (%s)", w.CaptureID, c.Captures[len(c.Captures)-1]), nil
	}
	if w.OwnCapture() {
		return "", nil
	}
	next, err := NextPaymentState(c.State, w.Type)
	if err != nil {
		return "", err
	}
	if next != c.State {
		return "", fmt.Errorf("capture %q of charge %s: %w", w.CaptureID, w.ChargeID, ErrCaptureNotRecorded)
	}
	return "", nil // it would move nothing: a capture.processing
}

// CaptureRecorder keeps the captures the lab made of its charges, as the
// provider answered its capture calls: a webhook moves a charge only when
// it names one of them. Recording one twice changes nothing.
type CaptureRecorder interface {
	RecordCapture(ctx context.Context, ns Namespace, chargeID, tenant, captureID string) error
}

// Changed reports whether the event moved the charge.
func (r WebhookResult) Changed() bool { return !r.Duplicate && r.Before != r.After }

// Webhook outcomes, as recorded and counted.
const (
	WebhookApplied   = "applied"   // moved the charge
	WebhookIgnored   = "ignored"   // a new event that did not move it (late, or already final)
	WebhookDuplicate = "duplicate" // an event id seen before
	WebhookMismatch  = "mismatch"  // a new event that does not match its charge: recorded, moved nothing
)

// Outcome names what the webhook did.
func (r WebhookResult) Outcome() string {
	switch {
	case r.Duplicate:
		return WebhookDuplicate
	case r.Mismatch != "":
		return WebhookMismatch
	case r.Changed():
		return WebhookApplied
	}
	return WebhookIgnored
}

// Payment is a charge as the ledger sees it, for reconciliation with the
// provider's records.
type Payment struct {
	ChargeID    string    `json:"charge_id"`
	Tenant      string    `json:"tenant"`
	Run         string    `json:"run,omitempty"`
	AmountCents int64     `json:"amount_cents"`
	Currency    string    `json:"currency"`
	State       string    `json:"payment_state"`
	Outbox      string    `json:"outbox_state,omitempty"` // its event's state; empty when it has none
	Webhooks    int       `json:"webhooks_applied"`       // webhook events processed for it that matched it
	CreatedAt   time.Time `json:"created_at"`
	// CaptureID is the capture the lab recorded of it last ("" when none);
	// CapturedAt when it recorded the first.
	CaptureID  string    `json:"capture_id,omitempty"`
	CapturedAt time.Time `json:"capture_recorded_at,omitzero"`
	// Mismatched counts the verified webhooks that did not match it
	// (recorded, moved nothing); Mismatch says why the latest did not.
	Mismatched int    `json:"webhooks_mismatched,omitempty"`
	Mismatch   string `json:"mismatch,omitempty"`
}
