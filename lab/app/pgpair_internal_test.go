package app

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb/throwaway"
	"github.com/idempotency-lab/lab/lab/relay"
)

// TestPGFailoverEndsAHoldNobodySettled: a failover held and never promoted
// keeps the pair from another namespace only for its turn; then the next
// hold ends it (promoting and rebuilding) and goes, and the namespace that
// held can no longer promote.
func TestPGFailoverEndsAHoldNobodySettled(t *testing.T) {
	t.Parallel()
	if _, err := throwaway.Find(); err != nil {
		t.Fatalf("the PostgreSQL pair needs the server binaries: %v", err)
	}
	log := slog.New(slog.DiscardHandler)
	f := newPGFailover(log, false)
	f.clock, f.size, f.appName = time.Now, 4, "pgpair-test"
	f.relay = relay.Defaults()
	f.relay.Clock, f.relay.Logger = time.Now, log
	t.Cleanup(f.Close)
	ctx := t.Context()
	if err := f.Hold(ctx, "a", lab.ReplicationAsync); err != nil {
		t.Fatal(err)
	}
	if err := f.Hold(ctx, "b", lab.ReplicationSync); !errors.Is(err, lab.ErrFailoverUnderWay) {
		t.Fatalf("b's hold during a's turn: %v, want the failover under way", err)
	}
	f.mu.Lock()
	f.since = time.Now().Add(-pgTurn) // a's turn is over, unpromoted
	f.mu.Unlock()
	if err := f.Hold(ctx, "b", lab.ReplicationSync); err != nil {
		t.Fatalf("b's hold after a's turn: %v", err)
	}
	if err := f.Promote(ctx, "a", nil); !errors.Is(err, lab.ErrFailoverUnderWay) {
		t.Fatalf("a's late promote: %v, want the failover under way", err)
	}
	if err := f.Promote(ctx, "b", nil); err != nil {
		t.Fatal(err)
	}
	if ev, err := f.Settle(ctx, "b", "run-b"); err != nil || ev.Replication != lab.ReplicationSync {
		t.Fatalf("b's settle: %+v, %v", ev, err)
	}
	// Whole again: the next failover holds at once, and a settle without a
	// promote ends it.
	if err := f.Hold(ctx, "a", lab.ReplicationAsync); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Settle(ctx, "a", "run-a"); err != nil {
		t.Fatal(err)
	}
}
