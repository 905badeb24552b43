package provider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"

	"github.com/idempotency-lab/lab/lab/prune"
)

// ErrKeyMismatch refuses a capture whose Idempotency-Key was first used
// with another request.
var ErrKeyMismatch = errors.New("idempotency key reused with another request")

// ErrWebhookFenced refuses to complete a webhook the claim no longer
// holds: its lease ran out and another worker claimed it, or it was reset.
var ErrWebhookFenced = errors.New("webhook claimed by another worker: completion refused")

// Records is where the provider keeps what it received (memory or
// PostgreSQL): the ground truth the lab compares its ledger with, and the
// webhooks it owes the lab, until they are delivered or dead.
type Records interface {
	// Capture records a capture under (tenant, key) once, and with it, in
	// the same step, the webhooks that announce it (none when it does not
	// apply). If the key exists with the same fingerprint it returns the
	// stored capture, its Requests counted one more, with Replayed; with
	// another fingerprint ErrKeyMismatch, and the stored capture is left as
	// it was (a refused request is not counted). Concurrent calls with one
	// key: exactly one applies. c.ID must be new: the stored capture
	// carries another ID exactly when the call did not apply. A receipt,
	// when not nil, is recorded in the same step as Receipt records it,
	// whether the capture applied or replayed, never when it was refused.
	Capture(ctx context.Context, c Capture, hooks []Webhook, receipt *Receipt) (Captured, error)
	// ClaimWebhooks leases up to limit due pending webhooks to one new
	// claim: each comes back with one more attempt, the claim's token, and
	// is hidden from other claims for lease. A webhook is due at its
	// NextAttempt, once every webhook before it of its capture (lower Seq)
	// is delivered or dead: a capture's webhooks go in order.
	ClaimWebhooks(ctx context.Context, now time.Time, limit int, lease time.Duration) ([]Webhook, error)
	// WebhookDelivered and WebhookFailed complete an attempt of a webhook
	// the claim token (w.ClaimToken) still holds, or change nothing and
	// return an error wrapping ErrWebhookFenced. WebhookFailed makes it
	// due again at next, or dead.
	WebhookDelivered(ctx context.Context, w Webhook, at time.Time, status int) error
	WebhookFailed(ctx context.Context, w Webhook, next time.Time, dead bool, status int, reason string) error
	// Receipt records a receipt by event id once; duplicate=true when it
	// was there already (its Deliveries is incremented).
	Receipt(ctx context.Context, r Receipt) (duplicate bool, err error)
	// Captures lists the captures f selects, newest first, at most
	// f.Limit of them (see Filter).
	Captures(ctx context.Context, f Filter) ([]Capture, error)
	// Stats sums what f selects (f.Limit is ignored).
	Stats(ctx context.Context, f Filter) (Stats, error)
	// Queued counts the webhooks still to send, of every namespace, at a
	// cost that follows the queue, not the records kept: what a poll
	// waiting for the queue to empty reads. It leaves out those the
	// receiver last refused as about a charge it does not hold (404) or a
	// capture it cannot place (409): they wait on something that may never
	// come, retried until their window ends, and a drain that waited for
	// them would wait out the window. Stats' WebhooksQueued counts them.
	Queued(ctx context.Context) (int, error)
	// Reset deletes a namespace's captures, receipts and webhooks ("" =
	// everything).
	Reset(ctx context.Context, ns string) error
}

// Pruner deletes settled records once they are older than a retention,
// which outlasts the webhooks' window: the receipts, and the webhooks
// delivered. Each call deletes at most limit of them, oldest first, and
// returns how many; Stats counts them as before, from a roll-up written in
// the same step. The captures are never pruned: they are the provider's
// ledger, what the lab is reconciled with, and their keys keep a late
// retry (a dead event re-queued) from capturing twice. Pending and dead
// webhooks stay too.
type Pruner interface {
	PruneReceipts(ctx context.Context, before time.Time, limit int) (int, error)
	PruneWebhooks(ctx context.Context, before time.Time, limit int) (int, error)
}

// PruneTargets are what a provider's records prune, for prune.Run.
func PruneTargets(p Pruner) []prune.Target {
	return []prune.Target{{Name: "provider receipts", Prune: p.PruneReceipts}, {Name: "provider webhooks", Prune: p.PruneWebhooks}}
}

// Webhook states.
const (
	WebhookPending   = "pending"   // to be sent, now or after a backoff
	WebhookDelivered = "delivered" // the lab answered 2xx
	WebhookDead      = "dead"      // given up: refused for good, or its window is over
)

// Webhook is one webhook the provider owes the lab, as its records keep
// it: written with the capture it announces, sent (signed at each attempt)
// until the lab answers 2xx or it is given up.
type Webhook struct {
	CaptureID string `json:"capture_id"`
	// Seq orders a capture's webhooks: each is sent once those before it
	// are delivered or dead.
	Seq       int    `json:"seq"`
	EventID   string `json:"event_id"` // a duplicate sends one event id twice
	Type      string `json:"type"`
	ChargeID  string `json:"charge_id"`
	Namespace string `json:"namespace"`
	Tenant    string `json:"tenant"`
	Run       string `json:"run,omitempty"`
	Body      []byte `json:"-"`
	// Forged: signed with a wrong secret (webhook_bad_signature).
	Forged      bool      `json:"forged"`
	State       string    `json:"state"`
	Attempts    int       `json:"attempts"` // begun, this one included once claimed
	NextAttempt time.Time `json:"next_attempt_at"`
	// GiveUpAt ends its window: no attempt is made after it.
	GiveUpAt   time.Time `json:"give_up_at"`
	CreatedAt  time.Time `json:"created_at"`
	ClaimToken string    `json:"-"`
	LastStatus int       `json:"last_status,omitempty"`
	LastError  string    `json:"last_error,omitempty"`
}

// Listing limits.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Filter selects records; an empty field selects any value.
type Filter struct {
	Namespace string
	Run       string
	ChargeID  string
	// Limit caps a listing: 0 means DefaultLimit, and anything else is
	// brought into 1..MaxLimit.
	Limit int
}

// EffectiveLimit is the number of captures a listing returns at most.
func (f Filter) EffectiveLimit() int {
	switch {
	case f.Limit == 0:
		return DefaultLimit
	case f.Limit < 1:
		return 1
	case f.Limit > MaxLimit:
		return MaxLimit
	}
	return f.Limit
}

// Capture statuses.
const (
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed" // declined
)

// Who sent a capture or a receipt.
const (
	ViaOutbox = "outbox" // the lab's relay, from the transactional outbox
	ViaDirect = "direct" // the charge path itself, outside any transaction
)

// Capture is one applied capture: the money the provider moved.
type Capture struct {
	ID          string    `json:"capture_id"` // "cap_" + uuid
	Key         string    `json:"idempotency_key"`
	ChargeID    string    `json:"charge_id"`
	Namespace   string    `json:"namespace"` // the lab's, for its tenant
	Tenant      string    `json:"tenant"`
	Run         string    `json:"run,omitempty"`
	AmountCents int64     `json:"amount_cents"`
	Currency    string    `json:"currency"`
	Via         string    `json:"via"`
	Status      string    `json:"status"`
	Requests    int       `json:"requests"` // requests that carried this key and were applied or replayed
	Fingerprint string    `json:"-"`
	CreatedAt   time.Time `json:"created_at"`
}

// Captured is what a capture call did, and the body of its answer.
type Captured struct {
	Capture       // as stored: the request's own when it applied
	Replayed bool `json:"replayed"`
	// ReceiptDuplicate: the receipt the call carried was there already, a
	// redelivery of its event.
	ReceiptDuplicate bool `json:"receipt_duplicate,omitempty"`
}

// Receipt is one receipt the provider sent, by the lab's outbox event id.
type Receipt struct {
	EventID    string    `json:"event_id"`
	ChargeID   string    `json:"charge_id"`
	Namespace  string    `json:"namespace"` // the lab's, for its tenant
	Tenant     string    `json:"tenant"`
	Run        string    `json:"run,omitempty"`
	Via        string    `json:"via"`
	Deliveries int       `json:"deliveries"`
	ReceivedAt time.Time `json:"received_at"`
}

// Stats sums the provider's records.
type Stats struct {
	CapturesApplied      int   `json:"captures_applied"`       // distinct captures recorded
	CaptureRequests      int   `json:"capture_requests"`       // sum of their Requests
	ChargesCapturedTwice int   `json:"charges_captured_twice"` // distinct charge ids with more than one capture
	CapturedCents        int64 `json:"captured_cents"`         // sum over succeeded captures
	Receipts             int   `json:"receipts"`               // distinct event ids
	ReceiptDeliveries    int   `json:"receipt_deliveries"`     // sum of their deliveries
	DirectCaptures       int   `json:"direct_captures"`        // captures sent with via=direct
	WebhooksQueued       int   `json:"webhooks_queued"`        // webhooks pending: due, backing off or being sent
	WebhooksDelivered    int   `json:"webhooks_delivered"`     // webhooks the lab acknowledged
	WebhooksDead         int   `json:"webhooks_dead"`          // webhooks given up
}

// CaptureRequest is the body of POST /captures.
type CaptureRequest struct {
	ChargeID string `json:"charge_id"`
	// Namespace is the lab's namespace of the tenant, as the lab resolved
	// it: the provider's faults and records are kept by it.
	Namespace   string `json:"namespace"`
	Tenant      string `json:"tenant"`
	Run         string `json:"run,omitempty"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Via         string `json:"via"`
	// EventID, when set, is the lab's event the capture delivers: its
	// receipt is sent with the capture, deduplicated by it, in the same
	// step (POST /receipts sends one alone).
	EventID string `json:"event_id,omitempty"`
}

// Fingerprint identifies what a capture asks for: its charge, tenant,
// amount and currency. Who sent it (via) and the lab run are left out, so
// a retry through another path is still the same request, and so is the
// event id.
func (r CaptureRequest) Fingerprint() string {
	// A JSON array keeps the fields apart whatever they hold.
	b, _ := json.Marshal([]any{r.ChargeID, r.Tenant, r.AmountCents, r.Currency}) // strings and an int always marshal
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ReceiptRequest is the body of POST /receipts.
type ReceiptRequest struct {
	EventID   string `json:"event_id"`
	ChargeID  string `json:"charge_id"`
	Namespace string `json:"namespace"` // as in CaptureRequest
	Tenant    string `json:"tenant"`
	Run       string `json:"run,omitempty"`
	Via       string `json:"via"`
}

// normalTime is how both stores keep times: UTC, to the microsecond
// (PostgreSQL's precision), so they answer alike.
func normalTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }
