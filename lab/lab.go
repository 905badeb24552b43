// Package lab holds the domain of the idempotency lab: charge requests, the
// ledger that records applied charges, the outbox that records their effects,
// and the Store interface that each idempotency design implements.
package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Endpoint is the scope name of the charge API; keys are scoped per endpoint.
const Endpoint = "POST /charges"

// StoreName names an idempotency design (a variant): "memory", "postgres"…
type StoreName string

// Verdict is what a run's ledger figures say about its store.
type Verdict string

// Verdicts.
const (
	Holds  Verdict = "holds"
	Breaks Verdict = "breaks"
	// Inconclusive: some attempts got no usable answer, or the fault's
	// race did not happen, so the ledger's count cannot be read as the
	// store's doing.
	Inconclusive Verdict = "inconclusive"
)

// Clock tells the time; services take one so tests can move it.
type Clock func() time.Time

// Namespace is the part of the lab one attendee owns: their tenants, keys,
// charges, runs and faults. A namespace holds two tenants: the one named
// like it, and a second one (its name plus SecondTenantSuffix) for the
// "two tenants, one key" scenario.
type Namespace string

// SecondTenantSuffix names a namespace's second tenant.
const SecondTenantSuffix = "~2"

// NamespaceOf is the namespace a tenant belongs to.
func NamespaceOf(tenant string) Namespace {
	ns, _, _ := strings.Cut(tenant, "~")
	return Namespace(ns)
}

// Includes reports whether a view of ns shows what belongs to other: the
// empty namespace stands for every namespace (the admin's view).
func (ns Namespace) Includes(other Namespace) bool { return ns == "" || ns == other }

// CheckNamespace accepts a name a namespace (and so a configured tenant)
// may have: 1..32 letters, digits, '-', '_' or '.'.
func CheckNamespace(name string) error {
	if name == "" || len(name) > 32 {
		return fmt.Errorf("a namespace name has 1..32 characters (got %d)", len(name))
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("a namespace name holds letters, digits, '-', '_' and '.' only (got %q)", name)
		}
	}
	return nil
}

// Scope identifies one logical operation: keys never cross tenants or endpoints.
type Scope struct {
	// Namespace is the tenant's, as the API resolved it from the caller's
	// token: decided once, there, and carried with every attempt.
	Namespace Namespace
	Tenant    string
	Endpoint  string
	Key       string
}

func (s Scope) String() string { return s.Tenant + "|" + s.Endpoint + "|" + s.Key }

// Attempt is one validated request on the charge path.
type Attempt struct {
	Scope       Scope
	Request     ChargeRequest
	Fingerprint string
	Run         string // lab run that sent it, "" outside the lab
	Replica     string // replica that served it
	Store       StoreName
	Faults      Faults
	// ChargeID names the charge this attempt may apply. A store that claimed
	// the key fixes it, so a retry of an unknown outcome reuses it and the
	// ledger's primary key stops a second charge.
	ChargeID string
}

// Response is what the server answers; completed responses are stored and
// replayed byte for byte.
type Response struct {
	Status int
	Body   []byte
}

// Outcome is a store's answer to an attempt.
type Outcome struct {
	Response Response
	Replayed bool
	// ReplayedFrom names where a replay was read when a design has more
	// than one place ("redis", "postgres"); empty otherwise.
	ReplayedFrom string
	// Pending, when set, says the operation is still running under a live
	// lease: the answer is 202 Accepted pointing at its status.
	Pending *Operation
}

// ErrFailoverUnderWay refuses a second failover of the Redis pair while
// one runs.
var ErrFailoverUnderWay = errors.New("a failover is under way on the Redis pair; retry when it ends")

// ErrOperationNotFound is a status asked of a key no operation holds.
var ErrOperationNotFound = errors.New("no operation under this key")

// OperationLooker reports a key's operation (stores whose work outlives
// the request: the lease store).
type OperationLooker interface {
	Operation(ctx context.Context, sc Scope) (Operation, error)
}

// Operation is a keyed charge still being worked on, as its status route
// and a 202 Accepted show it.
type Operation struct {
	Key          string    `json:"key"`
	State        string    `json:"state"` // in_flight or completed
	Token        int64     `json:"attempt_token"`
	LeaseExpires time.Time `json:"lease_expires_at"`
	// Response is the final answer once completed.
	Status int             `json:"response_status,omitempty"`
	Body   json.RawMessage `json:"response,omitempty"`
}

// Charge is an applied charge as the API returns it.
type Charge struct {
	ID           string    `json:"id"`
	Account      string    `json:"account"`
	AmountCents  int64     `json:"amount_cents"`
	Currency     string    `json:"currency"`
	OrderID      string    `json:"order_id,omitempty"`
	BalanceCents int64     `json:"balance_cents"`
	CreatedAt    time.Time `json:"created_at"`
}

// Entry is one ledger row: an applied charge tagged with what produced it.
type Entry struct {
	ChargeID    string
	Namespace   Namespace // the tenant's
	Tenant      string
	Account     string
	AmountCents int64
	Currency    string
	OrderID     string
	Key         string
	Store       StoreName
	Run         string
	Replica     string
	CreatedAt   time.Time
	// FenceToken, when set, is the claim's fencing token: the ledger
	// refuses the entry unless it is still the key's current token.
	FenceToken int64
}

// Event is an effect to deliver to the provider (a receipt e-mail).
type Event struct {
	ID          string    `json:"event_id"`
	Type        string    `json:"type"`
	ChargeID    string    `json:"charge_id"`
	Namespace   Namespace `json:"namespace"` // the tenant's
	Tenant      string    `json:"tenant"`
	Run         string    `json:"run,omitempty"`
	Payload     []byte    `json:"-"`
	State       string    `json:"state"`
	Attempts    int       `json:"attempts"`
	NextAttempt time.Time `json:"next_attempt_at"`
	LastError   string    `json:"last_error,omitempty"`
	// ClaimToken names the relay worker's claim that leased the event last;
	// only that claim may complete it (the fence).
	ClaimToken string `json:"claim_token,omitempty"`
	// LeaseExpires is when that claim's lease ends, zero when none holds it.
	LeaseExpires time.Time `json:"lease_expires_at,omitzero"`
	CreatedAt    time.Time `json:"created_at"`
	DeliveredAt  time.Time `json:"delivered_at,omitzero"`
}

// Outbox event states.
const (
	EventPending   = "pending"
	EventDelivered = "delivered"
	EventDead      = "dead"
)

// EventReceiptEmail is the only effect a charge has.
const EventReceiptEmail = "payment_receipt_email"

// Apply asks the ledger to record one charge, and with Event set its outbox
// event in the same atomic step.
type Apply struct {
	Entry      Entry
	Event      *Event
	FailOutbox bool // injected fault: writing the event fails, so nothing is kept
}

// RunStats are the ground-truth figures of one lab run.
type RunStats struct {
	Charges      int   // ledger entries created by the run
	ChargedCents int64 // their sum
	OutboxEvents int   // outbox events created by the run
	Delivered    int   // of those, the ones the relay delivered
	Dead         int   // of those, the ones the relay gave up on
	FencedWrites int   // ledger writes the fence refused: stale workers reported
}

// KeyTally is what the ledger holds for one key.
type KeyTally struct {
	Charges    int
	Cents      int64    // all of them
	FirstCents int64    // the first one, the only one that was wanted
	IDs        []string // the charges' ids, oldest first
}

// AccountMoney is one account's money read in one snapshot: the balance the
// ledger keeps beside its rows, and the sum of the rows themselves. They
// are equal unless a charge was half written (Jepsen's bank invariant).
type AccountMoney struct {
	BalanceCents int64 // the running balance, as each charge updated it
	RowsCents    int64 // the sum of the account's ledger rows
	Rows         int
}

// OverchargedCents is what the key's charges after the first cost.
func (k KeyTally) OverchargedCents() int64 { return k.Cents - k.FirstCents }

// StoreSummary aggregates the ledger per store.
type StoreSummary struct {
	Store             StoreName `json:"store"`
	ChargesApplied    int       `json:"charges_applied"`
	Operations        int       `json:"operations"` // distinct (tenant, key, order) charged
	DuplicatesApplied int       `json:"duplicates_applied"`
	AmountCents       int64     `json:"amount_cents"`
	OverchargedCents  int64     `json:"overcharged_cents"`
}

// OutboxBacklog is what the relay has yet to deliver: the pending events
// and the oldest one's age.
type OutboxBacklog struct {
	Pending          int
	OldestPendingAge time.Duration
}

// OutboxStats summarises the outbox.
type OutboxStats struct {
	Pending          int           `json:"outbox_pending"`
	Delivered        int           `json:"outbox_delivered"`
	Dead             int           `json:"outbox_dead"`
	InFlight         int           `json:"outbox_in_flight"` // pending, leased to a relay worker now
	Retries          int           `json:"outbox_retries"`   // delivery attempts beyond each event's first
	OldestPendingAge time.Duration `json:"-"`
}

// Ledger is the system of record: every applied charge is one entry. It is
// what a store needs to charge.
type Ledger interface {
	// Apply records a charge (and its event) atomically and returns it with
	// the account balance after it. It is idempotent by charge id: an entry
	// already in the ledger is returned as recorded, not applied again. A
	// duplicate order id yields *OrderConflictError.
	Apply(ctx context.Context, a Apply) (Charge, error)
}

// DirectSender sends an effect to the provider at once, outside any
// transaction: what a design without an outbox does.
type DirectSender interface {
	SendDirect(ctx context.Context, e Event) error
}

// Capturer captures a charge at the provider inline, under the key derived
// from the charge (so calling it again replays the one capture), records
// the capture and returns the provider's id for it. The phases design
// calls it between two of its phases.
type Capturer interface {
	CaptureInline(ctx context.Context, e Event, providerFault string) (captureID string, err error)
}

// KeyState describes one stored idempotency key for /idempotency/state.
type KeyState struct {
	Tenant      string    `json:"tenant"`
	Key         string    `json:"key"`
	State       string    `json:"state"` // in_flight or completed
	Fingerprint string    `json:"fingerprint"`
	Status      int       `json:"response_status,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	AgeMS       int64     `json:"age_ms"`
	// RecoveryPoint is the last phase the key committed, and CompletedBy
	// who finished it (request or completer), on a design of phases.
	RecoveryPoint string `json:"recovery_point,omitempty"`
	CompletedBy   string `json:"completed_by,omitempty"`
	// Response is the stored answer's body; only a lookup of one key reads it.
	Response json.RawMessage `json:"response,omitempty"`
}

// Key states.
const (
	KeyInFlight  = "in_flight"
	KeyCompleted = "completed"
	KeyAbsent    = "absent"
)

// Store is one idempotency design: how the server tells a first request from
// a retry before it charges. Everything else a store can do is an optional
// capability below, found by type assertion.
type Store interface {
	Name() StoreName
	// Charge runs the attempt through the store's idempotency decision.
	Charge(ctx context.Context, a Attempt) (Outcome, error)
}

// KeyLister lists stored keys for /idempotency/state.
type KeyLister interface {
	// Keys lists at most limit of the namespace's keys, newest first, and
	// how many it holds.
	Keys(ctx context.Context, ns Namespace, limit int) ([]KeyState, int, error)
}

// KeyLooker reports one key's state.
type KeyLooker interface {
	// Lookup reports one key: its state (KeyAbsent, and nothing else, when
	// there is none or it expired), fingerprint, times and stored response.
	Lookup(ctx context.Context, s Scope) (KeyState, error)
}

// Resetter forgets every key a store holds in a namespace ("" for all).
type Resetter interface {
	Reset(ctx context.Context, ns Namespace) error
}

// Restarter loses what the region's part of the store would lose if its
// process or server restarted (a namespace, "" for every namespace, or only
// its keys under a prefix): volatile state goes, durable state stays, and
// nothing outside the region is lost.
type Restarter interface {
	Restart(ctx context.Context, r Region) error
}

// Sweeper evicts expired keys and reports how many.
type Sweeper interface {
	Sweep(ctx context.Context) (int, error)
}

// InFlightAger reports how long the oldest operation still in flight has
// been: a claim nobody completed (a slow or dead worker). Zero when none.
type InFlightAger interface {
	OldestInFlight(ctx context.Context) (time.Duration, error)
}

// Completer finishes what crashed requests left: keys a request stopped
// short of their end, whose client did not come back. The lab runs one
// per process in the background.
type Completer interface {
	// Complete runs the remaining work of the keys left unfinished past
	// the store's threshold, and reports how many it finished.
	Complete(ctx context.Context) (int, error)
	// CompleterLag is how long the oldest such key has waited beyond the
	// threshold (zero when none): a completer that is not keeping up, or
	// not running, shows here.
	CompleterLag(ctx context.Context) (time.Duration, error)
}

// Describer says in one line where a running store keeps its keys.
type Describer interface {
	Describe() string
}

// Errors the charge path maps to problems.
var (
	ErrKeyReused        = errors.New("idempotency key reused with another request")
	ErrInProgress       = errors.New("a request with this idempotency key is still in progress")
	ErrStoreUnavailable = errors.New("store unavailable")
	// ErrCrash makes the server drop the connection without a response, as a
	// crashed process would.
	ErrCrash = errors.New("injected crash")
	// ErrOutcomeUnknown means a charge's commit may or may not have happened
	// and the ledger could not be asked; a retry with the same charge id
	// settles it.
	ErrOutcomeUnknown = errors.New("the charge's outcome is unknown")
	// ErrOutboxWrite is the injected outbox failure.
	ErrOutboxWrite = errors.New("injected failure writing the outbox event")
	// ErrFenced refuses a relay worker's completion of an event it no longer
	// holds: its claim was superseded (the lease expired and another worker
	// claimed the event), or the event was delivered, given up or re-queued.
	ErrFenced = errors.New("outbox event claimed by another worker: completion refused")
	// ErrEventNotFound is an outbox event that does not exist, or that
	// belongs to another namespace.
	ErrEventNotFound = errors.New("outbox event not found")
	// ErrEventDelivered refuses to re-queue an event already delivered.
	ErrEventDelivered = errors.New("outbox event already delivered")
	// ErrEventInFlight refuses to re-queue an event a relay worker holds.
	ErrEventInFlight = errors.New("outbox event is being delivered")
	// ErrRunNotFound is a run id the lab never opened (a Lab-Run header
	// must name a run of the caller's namespace).
	ErrRunNotFound = errors.New("no such run")
)

// OrderConflictError reports a charge for an order that was already charged.
type OrderConflictError struct {
	OrderID  string
	ChargeID string
}

func (e *OrderConflictError) Error() string {
	return fmt.Sprintf("order %q was already charged by %s", e.OrderID, e.ChargeID)
}

// InProgressError carries the Retry-After hint of a 409.
type InProgressError struct{ RetryAfter time.Duration }

func (e *InProgressError) Error() string { return ErrInProgress.Error() }
func (e *InProgressError) Unwrap() error { return ErrInProgress }
