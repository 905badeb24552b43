package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// NewEntry builds the ledger entry an attempt produces.
func NewEntry(a Attempt, now time.Time) Entry {
	id := a.ChargeID
	if id == "" {
		id = NewChargeID()
	}
	return Entry{
		ChargeID:    id,
		Namespace:   a.Scope.Namespace,
		Tenant:      a.Scope.Tenant,
		Account:     a.Request.Account,
		AmountCents: a.Request.AmountCents,
		Currency:    a.Request.Currency,
		OrderID:     a.Request.OrderID,
		Key:         a.Scope.Key,
		Store:       a.Store,
		Run:         a.Run,
		Replica:     a.Replica,
		CreatedAt:   now.UTC(),
	}
}

// NewChargeID returns a fresh charge id.
func NewChargeID() string { return "ch_" + uuid.NewString() }

// NewClaimToken names one relay claim: random, so no worker can guess
// another's.
func NewClaimToken() string { return uuid.NewString() }

// Capture key modes: how the relay keys its capture at the provider.
const (
	// CaptureKeyDerived derives the key from the operation
	// (<charge id>:capture), so every redelivery is a replay.
	CaptureKeyDerived = "derived"
	// CaptureKeyRandom draws a new key per attempt: the mistake that turns a
	// redelivery into a second capture.
	CaptureKeyRandom = "random"
)

// NewReceiptEvent builds the effects of a charge, delivered by the relay:
// the capture at the provider, then the receipt.
func NewReceiptEvent(e Entry, f Faults) *Event {
	mode := CaptureKeyDerived
	if f.RandomCaptureKey {
		mode = CaptureKeyRandom
	}
	var lost string
	if f.Has(FaultAppliedResponseLost) {
		lost = string(FaultAppliedResponseLost)
	}
	payload, _ := json.Marshal(receipt{ChargeID: e.ChargeID, Key: e.Key, Account: e.Account, AmountCents: e.AmountCents,
		Currency: e.Currency, CaptureKey: mode, ProviderFault: lost})
	return &Event{
		ID: uuid.NewString(), Type: EventReceiptEmail, ChargeID: e.ChargeID,
		Namespace: e.Namespace, Tenant: e.Tenant, Run: e.Run, Payload: payload, State: EventPending,
		NextAttempt: e.CreatedAt, CreatedAt: e.CreatedAt,
	}
}

// receipt is the payload of a receipt event.
type receipt struct {
	ChargeID    string `json:"charge_id"`
	Key         string `json:"idempotency_key,omitempty"`
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	CaptureKey  string `json:"capture_key,omitempty"`
	// ProviderFault is what the provider is asked to suffer on the first
	// delivery of the capture (applied_response_lost).
	ProviderFault string `json:"provider_fault,omitempty"`
}

// EffectDetails are what the relay needs to deliver a charge's effects.
type EffectDetails struct {
	AmountCents int64
	Currency    string
	CaptureKey  string // CaptureKeyDerived or CaptureKeyRandom
	// ProviderFault is the provider's fault for the first capture ("" for none).
	ProviderFault string
}

// Effects reads what the relay needs from the event's payload.
func (e Event) Effects() EffectDetails {
	var r receipt
	_ = json.Unmarshal(e.Payload, &r) // written by NewReceiptEvent
	if r.CaptureKey == "" {
		r.CaptureKey = CaptureKeyDerived
	}
	return EffectDetails{AmountCents: r.AmountCents, Currency: r.Currency, CaptureKey: r.CaptureKey, ProviderFault: r.ProviderFault}
}

// DerivedCaptureKey is the provider key of a charge's capture.
func DerivedCaptureKey(chargeID string) string { return chargeID + ":capture" }

// Receipt reads the idempotency key and the amount of a receipt event.
func (e Event) Receipt() (key string, amountCents int64) {
	var r receipt
	_ = json.Unmarshal(e.Payload, &r) // written by NewReceiptEvent; an older row just lacks the key
	return r.Key, r.AmountCents
}

// The statuses of the two answers a charge stores for replay, decided with
// the ledger's outcome; lab/api sends them as they are.
const (
	statusCreated  = 201 // http.StatusCreated
	statusConflict = 409 // http.StatusConflict
)

// ChargeResponse is the 201 the API sends and stores for replay. Like
// every JSON body of the lab it ends with a newline, so a shell prompt
// never sticks to it; the replay sends the same bytes.
func ChargeResponse(c Charge) Response {
	body, _ := json.Marshal(c)
	return Response{Status: statusCreated, Body: append(body, '\n')}
}

// ProblemTypeBase prefixes every problem's type URI.
const ProblemTypeBase = "https://idempotency.lab/problems/"

// Problem is an RFC 9457 problem document.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Code     string `json:"code"`
	Detail   string `json:"detail,omitempty"`
	Param    string `json:"param,omitempty"`
	ChargeID string `json:"charge_id,omitempty"`
}

// Response renders the problem: the one place problem bodies are written,
// whether sent at once or stored for replay.
func (p Problem) Response() Response {
	p.Type = ProblemTypeBase + p.Code
	body, _ := json.Marshal(p) // a struct of strings and an int always marshals
	return Response{Status: p.Status, Body: append(body, '\n')}
}

// OrderConflictResponse is the stored, deterministic business outcome of a
// charge whose order was already charged.
func OrderConflictResponse(oc *OrderConflictError) Response {
	return Problem{Title: "Order already charged", Status: statusConflict, Code: "order_already_charged",
		Detail: oc.Error(), ChargeID: oc.ChargeID}.Response()
}

// ledgerTimeout bounds one ledger write, which must not hang a request (or
// shutdown) on a database that stopped answering.
const ledgerTimeout = 10 * time.Second

// Perform is the work every store except postgres runs once it decided the
// attempt is first: charge the ledger (and record the event in the outbox,
// atomically) with the injected faults on the way. It returns the response
// to store, or an error: ErrOutcomeUnknown when the charge may have been
// applied, any other error when it was not.
func Perform(ctx context.Context, ledger Ledger, a Attempt, now time.Time) (Response, error) {
	if err := a.Faults.Pause(ctx); err != nil {
		return Response{}, err
	}
	entry := NewEntry(a, now)
	// Once started, the ledger write runs to its end even if the client
	// leaves: an interrupted commit is an outcome nobody knows.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ledgerTimeout)
	defer cancel()
	apply := Apply{Entry: entry, Event: NewReceiptEvent(entry, a.Faults), FailOutbox: a.Faults.Has(FaultOutboxFail)}
	var (
		c   Charge
		err error
	)
	// A failure may hide a commit whose answer was lost. Applying the same
	// charge id again is safe (the ledger returns the recorded charge), so
	// retry a little before giving up on knowing.
	for try := range 3 {
		if try > 0 {
			if serr := Sleep(ctx, time.Duration(try)*50*time.Millisecond); serr != nil {
				break // the write's own deadline ran out: the outcome stays unknown
			}
		}
		c, err = ledger.Apply(ctx, apply)
		var oc *OrderConflictError
		switch {
		case err == nil:
			Mark(ctx, PhaseCharge)
			return ChargeResponse(c), nil
		case errors.As(err, &oc):
			return OrderConflictResponse(oc), nil
		case errors.Is(err, ErrOutboxWrite):
			return Response{}, fmt.Errorf("error applying charge: %w", err) // rolled back: nothing was charged
		}
	}
	return Response{}, fmt.Errorf("%w: charge %s: %w", ErrOutcomeUnknown, entry.ChargeID, err)
}
