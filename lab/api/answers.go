package api

import (
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/provider"
)

// The JSON answers of the lab's routes, one type per route. Attendees'
// scripts read these names, and testdata/answers/ pins them (see
// answers_test.go). Most declare their fields in alphabetical order: they
// were maps until they had types, and encoding/json writes a map's keys
// sorted, so the order stays the one clients have always seen. Those that
// had types before (runsAnswer, openRunAnswer, peerRow, peerCounters, and
// Index in server.go) keep theirs.

// healthAnswer is GET /health.
type healthAnswer struct {
	Case    string `json:"case"`
	Replica string `json:"replica"`
	Stack   string `json:"stack"`
	Status  string `json:"status"`
}

// readyAnswer is GET /ready: each configured dependency, by name.
type readyAnswer struct {
	Dependencies map[string]dependencyState `json:"dependencies"`
	Ledger       string                     `json:"ledger"`
	Replica      string                     `json:"replica"`
}

// dependencyState is one dependency of GET /ready: "ok", or "down" and why.
type dependencyState struct {
	Describe string `json:"describe"`
	Error    string `json:"error,omitempty"`
	Status   string `json:"status"`
}

// resetAnswer is /reset-lab: what was deleted, and what was not touched.
type resetAnswer struct {
	Deleted   string `json:"deleted"`
	Ledger    string `json:"ledger"`
	Message   string `json:"message"`
	Namespace string `json:"namespace"`
	Reset     bool   `json:"reset"`
	Status    string `json:"status"`
}

// restartAnswer is POST /lab/restart-store.
type restartAnswer struct {
	KeyPrefix string        `json:"key_prefix"`
	Namespace string        `json:"namespace"`
	Replica   string        `json:"replica"`
	Restarted lab.StoreName `json:"restarted"`
}

// joinAnswer is POST /lab/join: the attendee's token and namespace.
type joinAnswer struct {
	Namespace    lab.Namespace `json:"namespace"`
	Note         string        `json:"note"`
	SecondTenant string        `json:"second_tenant"`
	Tenant       string        `json:"tenant"`
	Token        string        `json:"token"`
}

// failoverAnswer is POST /lab/failover.
type failoverAnswer struct {
	Namespace string `json:"namespace"`
	Step      string `json:"step"`
}

// keyStateAnswer is GET /idempotency/state?store=…&key=…: one key's state.
type keyStateAnswer struct {
	Store lab.StoreName `json:"store"`
	Seen  string        `json:"key_state"` // as the runs' key_before/key_after name it
	lab.KeyState
}

// stateAnswer is GET /idempotency/state: the stored keys of each store,
// and the multi-language lab's fields (keys, key_count, balance_cents…).
type stateAnswer struct {
	Account        string                      `json:"account"`
	BalanceCents   map[string]int64            `json:"balance_cents"` // per tenant of the namespace
	DedupeWindowMS int64                       `json:"dedupe_window_ms"`
	KeyCount       int                         `json:"key_count"`
	Keys           map[string]peerKey          `json:"keys"`
	KeysStore      lab.StoreName               `json:"keys_store"`
	LedgerCents    map[string]int64            `json:"ledger_cents"` // per account
	Limit          int64                       `json:"limit"`
	Namespace      string                      `json:"namespace"`
	Note           string                      `json:"note"`
	Replica        string                      `json:"replica"`
	Stores         map[lab.StoreName]storeKeys `json:"stores"`
}

// storeKeys are one store's keys in GET /idempotency/state.
type storeKeys struct {
	Keys  []lab.KeyState `json:"keys"`
	Total int            `json:"total"`
	Where string         `json:"where"`
}

// peerKey is a key as the multi-language lab shows it.
type peerKey struct {
	AgeMS       int64  `json:"age_ms"`
	Expired     bool   `json:"expired"`
	HasResponse bool   `json:"has_response"`
	Tenant      string `json:"tenant"`
}

// outboxAnswer is GET /outbox: the namespace's events, their counts, and
// what the provider says it received.
type outboxAnswer struct {
	Delivered           []peerRow      `json:"delivered"`
	DeliveredTotal      int            `json:"delivered_total"`
	Deliveries          int            `json:"deliveries"`
	DuplicateDeliveries int            `json:"duplicate_deliveries"`
	Events              []lab.Event    `json:"events"`
	Limit               int64          `json:"limit"`
	Note                string         `json:"note"`
	OldestPendingMS     int64          `json:"oldest_pending_ms"`
	Outbox              []peerRow      `json:"outbox"`
	OutboxDead          int            `json:"outbox_dead"`
	OutboxDelivered     int            `json:"outbox_delivered"`
	OutboxInFlight      int            `json:"outbox_in_flight"`
	OutboxPending       int            `json:"outbox_pending"`
	OutboxRetries       int            `json:"outbox_retries"`
	OutboxTotal         int            `json:"outbox_total"`
	Provider            provider.Stats `json:"provider"`
	Receipts            int            `json:"receipts"`
	SideEffectTransport string         `json:"side_effect_transport"`
}

// requeueAnswer is POST /outbox/{id}/retry.
type requeueAnswer struct {
	Replica  string    `json:"replica"`
	Requeued lab.Event `json:"requeued"`
}

// summaryAnswer is GET /diagnostics/summary.
type summaryAnswer struct {
	Case            string                   `json:"case"`
	Interpretation  summaryInterpretation    `json:"interpretation"`
	Ledger          string                   `json:"ledger"`
	Namespace       string                   `json:"namespace"`
	OutboxDead      int                      `json:"outbox_dead"`
	OutboxDelivered int                      `json:"outbox_delivered"`
	OutboxPending   int                      `json:"outbox_pending"`
	RecentRuns      []experiment.Report      `json:"recent_runs"`
	Replica         string                   `json:"replica"`
	Stack           string                   `json:"stack"`
	Stores          []lab.StoreSummary       `json:"stores"`
	Variants        map[string]*peerCounters `json:"variants"` // "unsafe" and "idempotent"
}

// summaryInterpretation says how to read the summary's counters.
type summaryInterpretation struct {
	GoNote     string `json:"go_note"`
	Idempotent string `json:"idempotent"`
	Unsafe     string `json:"unsafe"`
}

// The lines of GET /lab/matrix?format=ndjson, in the order they come.
type (
	// matrixLayout opens the stream: the stores and cases, and how many cells.
	matrixLayout struct {
		Cases  []experiment.Case `json:"cases"`
		Stores []lab.StoreName   `json:"stores"`
		Total  int               `json:"total"`
	}
	// matrixProgress is one cell, as soon as it is decided.
	matrixProgress struct {
		Case  string          `json:"case"`
		Cell  experiment.Cell `json:"cell"`
		Done  int             `json:"done"`
		Total int             `json:"total"`
	}
	// matrixFailure ends a stream the matrix could not finish.
	matrixFailure struct {
		Error lab.Problem `json:"error"`
	}
	// matrixDone ends a finished stream.
	matrixDone struct {
		WallMS float64 `json:"wall_ms"`
	}
)

// webhookAnswer is POST /webhooks/provider.
type webhookAnswer struct {
	EventID string `json:"event_id"`
	Outcome string `json:"outcome"`
	lab.WebhookResult
}

// openRunAnswer is POST /lab/runs.
type openRunAnswer struct {
	RunID     string `json:"run_id"`
	Namespace string `json:"namespace"`
	Note      string `json:"note"`
}

// runsAnswer is GET /lab/runs.
type runsAnswer struct {
	Namespace string              `json:"namespace"`
	Replica   string              `json:"replica"`
	Runs      []experiment.Report `json:"runs"`
	Note      string              `json:"note"`
}

// peerRow is an outbox row as the multi-language lab shows it.
type peerRow struct {
	Key         string    `json:"key"`
	Kind        string    `json:"kind"`
	AmountCents int64     `json:"amount_cents"`
	At          time.Time `json:"at"`
	Status      string    `json:"status"`
	Via         string    `json:"via"`
}

// peerCounters are the multi-language lab's running counters of one kind
// of variant.
type peerCounters struct {
	Runs                int   `json:"runs"`
	Attempts            int   `json:"attempts"`
	ChargesApplied      int   `json:"charges_applied"`
	DuplicatesPrevented int   `json:"duplicates_prevented"`
	DuplicatesApplied   int   `json:"duplicates_applied"`
	IdempotencyHits     int   `json:"idempotency_hits"`
	SideEffectsEmitted  int   `json:"side_effects_emitted"`
	OverchargedCents    int64 `json:"overcharged_cents"`
}
