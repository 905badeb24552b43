package lab

import (
	"errors"
	"fmt"
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
// the provider retries it).
var (
	ErrUnknownWebhookType = errors.New("unknown webhook event type")
	ErrUnknownCharge      = errors.New("the webhook names a charge the ledger does not hold")
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
}

// WebhookResult is what processing a webhook did.
type WebhookResult struct {
	// Duplicate: the event id was processed before; nothing changed.
	Duplicate bool `json:"duplicate"`
	// Before and After are the charge's payment state around the event.
	Before string `json:"state_before,omitempty"`
	After  string `json:"state_after,omitempty"`
}

// Changed reports whether the event moved the charge.
func (r WebhookResult) Changed() bool { return !r.Duplicate && r.Before != r.After }

// Webhook outcomes, as recorded and counted.
const (
	WebhookApplied   = "applied"   // moved the charge
	WebhookIgnored   = "ignored"   // a new event that did not move it (late, or already final)
	WebhookDuplicate = "duplicate" // an event id seen before
)

// Outcome names what the webhook did.
func (r WebhookResult) Outcome() string {
	switch {
	case r.Duplicate:
		return WebhookDuplicate
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
	Webhooks    int       `json:"webhooks_applied"`       // webhook events processed for it
	CreatedAt   time.Time `json:"created_at"`
}
