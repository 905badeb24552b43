package lease

// What a stepped run reads and moves: which stepped attempt won a token,
// the key's row (lab.KeyInspector), and the lease's and the window's end
// made to happen now (lab.TimeMover).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-lab/lab/lab"
)

// stepClaims names the stepped attempt that won each token on this store
// (a token won on another replica is named by that replica's store).
type stepClaims struct {
	mu sync.Mutex
	by map[tokenOf]stepClaim
}

type tokenOf struct {
	scope lab.Scope
	token int64
}

type stepClaim struct {
	name string
	at   time.Time
}

// stepClaimsKept is how long a name is kept: past any stepped run's life.
const stepClaimsKept = 10 * lab.StepWait

// hold remembers which stepped attempt won the token; any other attempt
// costs one context lookup.
func (s *Store) hold(ctx context.Context, sc lab.Scope, token int64) {
	name := lab.StepName(ctx)
	if name == "" {
		return
	}
	now, c := time.Now(), &s.stepClaims
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, held := range c.by {
		if now.Sub(held.at) > stepClaimsKept {
			delete(c.by, k)
		}
	}
	if c.by == nil {
		c.by = map[tokenOf]stepClaim{}
	}
	c.by[tokenOf{sc, token}] = stepClaim{name, now}
}

// holder names who won the token: a stepped attempt, or a request.
func (s *Store) holder(sc lab.Scope, token int64) string {
	s.stepClaims.mu.Lock()
	c, ok := s.stepClaims.by[tokenOf{sc, token}]
	s.stepClaims.mu.Unlock()
	if !ok {
		return "a request"
	}
	return fmt.Sprintf("attempt %s (%s)", c.name[strings.LastIndexByte(c.name, '/')+1:], c.name)
}

// TimeMoves are the events a lease key lives by.
func (s *Store) TimeMoves() []lab.TimeEvent {
	return []lab.TimeEvent{lab.EventLease, lab.EventWindow, lab.EventWait}
}

// MakeHappen makes a time-driven event happen to the key now, on the
// store's clock: the lease ends, or the retention window passes.
func (s *Store) MakeHappen(ctx context.Context, sc lab.Scope, ev lab.TimeEvent) error {
	var q string
	switch ev {
	case lab.EventLease: // the holder's token stays: its write will be fenced
		q = `UPDATE lease_requests SET lease_expires_at = $4
			WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND state = 'in_flight' AND lease_expires_at > $4`
	case lab.EventWindow: // a claim in flight is the lease's to end
		q = `UPDATE lease_requests SET expires_at = $4
			WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3 AND state = 'completed' AND expires_at > $4`
	case lab.EventWait: // the twins' polls, bounded by lab.WaitBound, are ended already
		return nil
	case lab.EventTTL:
		return lab.Invalid("event", "lease has no TTL: its claim's lifetime is a lease (the lease move ends it)")
	case lab.EventFailover:
		return lab.Invalid("event", "lease has no Redis to fail over: its claims and tokens live in PostgreSQL")
	default:
		return lab.Invalid("event", "lease has no %q to make happen", ev)
	}
	// Nothing to change (no claim in flight, a replica sharing the table
	// did it already) is no error.
	if _, err := s.pool.Exec(ctx, sc.Namespace, q, sc.Tenant, sc.Endpoint, sc.Key, s.now()); err != nil {
		return fmt.Errorf("error making the %s happen: %w", ev, err)
	}
	return nil
}

// Inspect says what lease_requests holds for the key, as committed: a
// claim is committed at once, so it shows while its worker works.
func (s *Store) Inspect(ctx context.Context, sc lab.Scope) (lab.KeyInspection, error) {
	in := lab.KeyInspection{Where: "PostgreSQL table lease_requests", State: lab.KeyAbsent, Shared: true}
	var r row
	var retentionEnds time.Time
	var fenced, stale int64
	err := s.pool.QueryRow(ctx, sc.Namespace, `
		SELECT state, attempt_token, request_fingerprint, charge_id, lease_expires_at, expires_at, response_status, response_body,
		       (SELECT count(*) FROM fenced_writes f WHERE f.tenant_id = $1 AND f.idempotency_key = $3),
		       (SELECT coalesce(max(stale_token), 0) FROM fenced_writes f WHERE f.tenant_id = $1 AND f.idempotency_key = $3)
		FROM lease_requests WHERE tenant_id = $1 AND endpoint = $2 AND idempotency_key = $3`,
		sc.Tenant, sc.Endpoint, sc.Key).
		Scan(&r.state, &r.token, &r.fingerprint, &r.chargeID, &r.leaseExpires, &retentionEnds, &r.status, &r.body, &fenced, &stale)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		in.Facts = []string{"no row: the next attempt claims the key with a new token"}
		return in, nil
	case err != nil:
		return in, fmt.Errorf("error reading key: %w", err)
	}
	now := s.now()
	in.State = r.state
	in.Facts = append(in.Facts, fmt.Sprintf("token %d, won by %s", r.token, s.holder(sc, r.token)))
	switch {
	case r.state == lab.KeyInFlight && now.Before(r.leaseExpires):
		in.Facts = append(in.Facts, "lease ends in "+lab.Span(r.leaseExpires.Sub(now)), "its charge will be "+r.chargeID)
	case r.state == lab.KeyInFlight:
		in.Facts = append(in.Facts, fmt.Sprintf("lease ended %s ago: the next attempt takes the key over with a higher token, "+
			"and a write with token %d will be fenced", lab.Span(now.Sub(r.leaseExpires)), r.token))
	case r.status != nil:
		in.Facts = append(in.Facts, "completed: "+answered(*r.status, r.body))
	}
	switch {
	case fenced == 1:
		in.Facts = append(in.Facts, fmt.Sprintf("a write with stale token %d was fenced", stale))
	case fenced > 1:
		in.Facts = append(in.Facts, fmt.Sprintf("%d writes were fenced, the latest with stale token %d", fenced, stale))
	}
	in.Facts = append(in.Facts, "fingerprint "+lab.ShortFingerprint(r.fingerprint))
	if now.Before(retentionEnds) {
		in.Facts = append(in.Facts, "expires in "+lab.Span(retentionEnds.Sub(now)))
	} else {
		then := "the next attempt takes the key over"
		if r.state != lab.KeyCompleted {
			then = "a sweep deletes the row"
		}
		in.Facts = append(in.Facts, fmt.Sprintf("its retention ended %s ago: %s", lab.Span(now.Sub(retentionEnds)), then))
	}
	return in, nil
}

// answered is a stored response in a few words: its status and the charge.
func answered(status int, body []byte) string {
	var b struct {
		ID       string `json:"id"`
		Code     string `json:"code"`
		ChargeID string `json:"charge_id"`
	}
	_ = json.Unmarshal(body, &b) // what it cannot read it does not show
	switch {
	case b.ID != "":
		return fmt.Sprintf("%d, charge %s", status, b.ID)
	case b.ChargeID != "":
		return fmt.Sprintf("%d %s, the order's charge %s", status, b.Code, b.ChargeID)
	}
	return fmt.Sprint(status)
}

var (
	_ lab.KeyInspector = (*Store)(nil)
	_ lab.TimeMover    = (*Store)(nil)
)
