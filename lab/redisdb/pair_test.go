package redisdb_test

import (
	"errors"
	"os"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/redisdb"
)

// TestFailoverLosesWhatDidNotReplicate: a write acknowledged by the
// primary while replication is held back is gone once the replica is
// promoted; what replicated before stays, and the client follows the new
// primary.
func TestFailoverLosesWhatDidNotReplicate(t *testing.T) {
	if _, err := redisdb.FindServer(); err != nil {
		if os.Getenv("LAB_REQUIRE_SERVICES") == "1" {
			t.Fatalf("%v; LAB_REQUIRE_SERVICES=1 makes that a failure", err)
		}
		t.Skip(err)
	}
	ctx := t.Context()
	p, err := redisdb.StartPair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := p.Client()
	defer c.Close()
	first := p.PrimaryAddr()
	if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	replica := goredis.NewClient(&goredis.Options{Addr: p.ReplicaAddr()})
	defer replica.Close()
	// Replication is the redis-servers' own: the test asks the replica.
	labtest.Eventually(t, "the replica getting the first write", func() bool { return replica.Get(ctx, "before").Val() == "1" })
	if err := p.HoldReplication(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "during", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if p.PrimaryAddr() == first {
		t.Fatal("the primary did not change")
	}
	if v := c.Get(ctx, "before").Val(); v != "1" {
		t.Fatalf("a replicated write after the failover: %q", v)
	}
	if err := c.Get(ctx, "during").Err(); !errors.Is(err, goredis.Nil) {
		t.Fatalf("the write acknowledged while replication was held: %v; want it lost", err)
	}
	// The pair is whole again: the old primary follows the new one.
	if err := c.Set(ctx, "after", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	old := goredis.NewClient(&goredis.Options{Addr: first})
	defer old.Close()
	labtest.Eventually(t, "the old primary following the new one", func() bool { return old.Get(ctx, "after").Val() == "1" })
}

// TestPairSharedByTwoProcesses: two labs given the same pair (in either
// order) see one failover: the second's hold is refused while the first's
// is under way, and each one's client follows the new primary.
func TestPairSharedByTwoProcesses(t *testing.T) {
	if _, err := redisdb.FindServer(); err != nil {
		if os.Getenv("LAB_REQUIRE_SERVICES") == "1" {
			t.Fatalf("%v; LAB_REQUIRE_SERVICES=1 makes that a failure", err)
		}
		t.Skip(err)
	}
	ctx := t.Context()
	own, err := redisdb.StartPair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	first := own.PrimaryAddr()
	given, err := redisdb.ConnectPair(ctx, "redis://"+own.ReplicaAddr()+"/0", "redis://"+first+"/0")
	if err != nil {
		t.Fatal(err)
	}
	if given.PrimaryAddr() != first {
		t.Fatalf("the given pair found %s as primary, want %s", given.PrimaryAddr(), first)
	}
	if err := own.HoldReplication(ctx); err != nil {
		t.Fatal(err)
	}
	if err := given.HoldReplication(ctx); !errors.Is(err, redisdb.ErrHeld) {
		t.Fatalf("a second hold: %v, want ErrHeld", err)
	}
	if held, err := given.Held(ctx); err != nil || !held {
		t.Fatalf("the other process sees held=%v (%v)", held, err)
	}
	if err := given.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	c := own.Client() // the process that did not promote
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("a write through the other process's client after the failover: %v", err)
	}
	if own.PrimaryAddr() == first {
		t.Fatal("the other process still takes the old primary for the primary")
	}
	if held, err := own.Held(ctx); err != nil || held {
		t.Fatalf("after the failover: held=%v (%v)", held, err)
	}
}
