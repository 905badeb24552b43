//go:build linux

package throwaway_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb/throwaway"
)

// count is how many rows of ledger hold id on c.
func count(t *testing.T, c *throwaway.Cluster, id string) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM ledger WHERE id = $1", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFailoverLosesWhatAsyncAcknowledged fails a pair over 20 times in each
// mode, the standby held from receiving WAL before each write. Async: the
// primary acknowledges the write, the promoted standby never had it, and
// the retry writes it again: 20 of 20 lost. Sync: the write waits for the
// standby and is never acknowledged, so nothing acknowledged is lost (the
// old primary has it committed locally, which the failover discards).
func TestFailoverLosesWhatAsyncAcknowledged(t *testing.T) {
	requireBinaries(t)
	const rounds = 20
	for _, mode := range []throwaway.Replication{throwaway.Async, throwaway.Sync} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			p, err := throwaway.StartPair(ctx, slog.New(slog.DiscardHandler), mode)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := p.Close(); err != nil {
					t.Error(err)
				}
			})
			conn, err := pgx.Connect(ctx, p.Primary().URL())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "CREATE TABLE ledger (id text PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			conn.Close(ctx)
			lost, acknowledged := 0, 0
			for round := range rounds {
				if err := p.WaitCaughtUp(ctx); err != nil {
					t.Fatal(err)
				}
				id := fmt.Sprintf("ch_%s_%d", mode, round)
				if err := p.Hold(ctx); err != nil {
					t.Fatal(err)
				}
				wctx, cancel := context.WithCancel(ctx)
				written := make(chan error, 1)
				go func() {
					c, err := pgx.Connect(wctx, p.Primary().URL())
					if err == nil {
						_, err = c.Exec(wctx, "INSERT INTO ledger VALUES ($1)", id)
						c.Close(context.Background())
					}
					written <- err
				}()
				if mode == throwaway.Async {
					if err := <-written; err != nil {
						t.Fatalf("round %d: the async write: %v", round, err)
					}
				} else {
					waitSyncRep(t, p.Primary(), 1)
				}
				if err := p.Promote(ctx); err != nil {
					t.Fatal(err)
				}
				if mode == throwaway.Sync {
					cancel() // the client gives up on an answer that never came
					if err := <-written; err == nil {
						t.Fatalf("round %d: the sync write was acknowledged with its standby held", round)
					}
					waitSyncRep(t, p.Old(), 0) // the cancelled wait ended: its local commit is visible
				}
				cancel()
				old, promoted := count(t, p.Old(), id), count(t, p.Primary(), id)
				if old != 1 {
					t.Fatalf("round %d: the old primary holds %d row(s) of %s, want its local commit", round, old, id)
				}
				if mode == throwaway.Async {
					acknowledged++
				}
				if mode == throwaway.Async && promoted == 0 {
					lost++
				}
				// The retry, on the new primary, as a client would send it.
				if c, err := pgx.Connect(ctx, p.Primary().URL()); err != nil {
					t.Fatal(err)
				} else if _, err := c.Exec(ctx, "INSERT INTO ledger VALUES ($1) ON CONFLICT DO NOTHING", id); err != nil || count(t, p.Primary(), id) != 1 {
					t.Fatalf("round %d: the retry on the new primary: %v", round, errors.Join(err, c.Close(ctx)))
				} else {
					c.Close(ctx)
				}
				if err := p.Rebuild(ctx); err != nil {
					t.Fatal(err)
				}
			}
			switch mode {
			case throwaway.Async:
				if lost != rounds {
					t.Errorf("async: %d of %d acknowledged writes lost by the failover, want every one", lost, acknowledged)
				}
			case throwaway.Sync:
				if acknowledged != 0 {
					t.Errorf("sync: %d write(s) acknowledged with the standby held", acknowledged)
				}
			}
		})
	}
}

// waitSyncRep waits until as many sessions on c as want wait for the
// standby to confirm their commit (wait_event SyncRep): such a commit is
// in the WAL, and visible to others only once the wait ends.
func waitSyncRep(t *testing.T, c *throwaway.Cluster, want int) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	labtest.Eventually(t, fmt.Sprintf("%d session(s) waiting for the standby", want), func() bool {
		var n int
		if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == want
	})
}
