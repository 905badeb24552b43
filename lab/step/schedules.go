package step

import (
	"fmt"

	"github.com/idempotency-lab/lab/lab"
)

// Schedule is a named interleaving: which attempt moves at each step (or
// which time-driven event happens), and the outcome it gives every time.
type Schedule struct {
	Name     string        `json:"name"`
	Store    lab.StoreName `json:"store"`
	Replicas int           `json:"replicas"`
	Attempts int           `json:"attempts"`
	// Faults is the Lab-Fault the run's attempts carry: a fault for the
	// first, the store's parameters (ttl_ms) for all.
	Faults  string `json:"faults,omitempty"`
	Steps   []Move `json:"steps"`
	Charges int    `json:"charges"` // ledger entries it leaves for the key
	// Lost are the charges a client was told of that the surviving books
	// lack: a PostgreSQL failover's break, which leaves one entry.
	Lost  int    `json:"lost,omitempty"`
	Shows string `json:"shows"`
	// Case is the matrix case whose race it plays on Store, "" for none.
	Case string `json:"case,omitempty"`
}

// ForCell is the named schedule that plays the matrix cell of store and
// case move by move, "" when none does.
func ForCell(store lab.StoreName, matrixCase string) string {
	for _, s := range Schedules() {
		if s.Store == store && s.Case == matrixCase && matrixCase != "" {
			return s.Name
		}
	}
	return ""
}

// moves writes a schedule compactly: numbers are attempts, strings events.
func moves(ms ...any) []Move {
	out := make([]Move, 0, len(ms))
	for _, m := range ms {
		switch m := m.(type) {
		case int:
			out = append(out, A(m))
		case lab.TimeEvent:
			out = append(out, E(m))
		default:
			panic(fmt.Sprintf("step: a move is an attempt or an event, not %T", m))
		}
	}
	return out
}

// Schedules are the named schedules, one per cell of the lesson that has
// one. The store names are the variants' own.
func Schedules() []Schedule {
	ttl, lease, window, lock := lab.EventTTL, lab.EventLease, lab.EventWindow, lab.EventLock
	return []Schedule{
		{Name: "look-first-both-look", Case: "retries", Store: "look-first", Replicas: 1, Attempts: 2, Charges: 2,
			// 1,2: both at before_claim; 1,2: both looked and found nothing;
			// 1,1: attempt 1 charges and answers; 2,2: so does attempt 2.
			Steps: moves(1, 2, 1, 2, 1, 1, 2, 2),
			Shows: "both look, then both write: each found nothing, so each charged — the check and the act are two steps"},
		{Name: "look-first-one-after-the-other", Store: "look-first", Replicas: 1, Attempts: 2, Charges: 1,
			// attempt 1 looks, charges and answers; attempt 2 then looks and replays.
			Steps: moves(1, 1, 1, 1, 2, 2),
			Shows: "one looks and writes, then the other looks: it finds the answer and replays — the same design, decided by the interleaving alone"},
		{Name: "memory-both-claim", Case: "replicas", Store: "memory", Replicas: 2, Attempts: 2, Charges: 2,
			// each attempt claims in its own replica's map before either completes.
			Steps: moves(1, 2, 1, 2, 1, 1, 2, 2),
			Shows: "both claim before either completes, on two replicas: each replica's map said yes, and each charged"},
		{Name: "memory-one-replica", Case: "retries", Store: "memory", Replicas: 1, Attempts: 2, Charges: 1,
			// 1,1: attempt 1 claims; 2,2: attempt 2 finds the claim and
			// waits on it (blocked); 1,1: attempt 1 charges and completes,
			// which wakes attempt 2 with the answer to replay.
			Steps: moves(1, 1, 2, 2, 1, 1),
			Shows: "the same moves on one replica: attempt 2 finds attempt 1's claim in the one map and waits for its answer"},
		{Name: "memory-after-the-window", Case: "expired", Store: "memory", Replicas: 1, Attempts: 2, Charges: 2,
			// attempt 1 charges and answers; the retention window passes;
			// attempt 2, a late retry, finds no key and charges again.
			Steps: moves(1, 1, 1, 1, window, 2, 2, 2, 2),
			Shows: "a retry after the retention window: the key is forgotten, so the late retry is a new charge"},
		{Name: "redis-ttl-runs-out", Case: "slow_short_ttl", Store: "redis", Replicas: 1, Attempts: 2, Charges: 2, Faults: "ttl_ms=60000",
			// 1,1: attempt 1 claims (a 60 s TTL) and pauses before its
			// charge; ttl: the claim's TTL runs out, now; 2,2: attempt 2
			// claims the free key; 1,1,2,2: both charge and answer.
			Steps: moves(1, 1, ttl, 2, 2, 1, 1, 2, 2),
			Shows: "the claim's TTL runs out while its owner still works: a retry claims the key again and both charge — a lock with a TTL is no fence"},
		{Name: "redis-ttl-holds", Case: "slow_long_ttl", Store: "redis", Replicas: 1, Attempts: 2, Charges: 1, Faults: "ttl_ms=60000",
			// without the TTL's end: attempt 2 finds the claim and waits
			// (blocked), and replays once attempt 1 completes.
			Steps: moves(1, 1, 2, 2, 1, 1),
			Shows: "the same moves while the claim lives: attempt 2 waits on it and replays attempt 1's answer"},
		{Name: "redis-failover-loses-the-claim", Case: "redis_failover", Store: "redis", Replicas: 1, Attempts: 2, Charges: 2, Faults: "failover",
			// replication is held from the start; 1,1: attempt 1 claims on
			// the primary alone; failover: the replica, which never saw the
			// claim, is promoted; 2,2: attempt 2 claims the same key there;
			// 1,1,2,2: both charge and answer.
			Steps: moves(1, 1, lab.EventFailover, 2, 2, 1, 1, 2, 2),
			Shows: "Redis fails over before the claim replicated: the new primary never saw it, so a retry claims the key again and both charge"},
		{Name: "pg-async-loses-the-charge", Case: "pg_failover_async", Store: "postgres", Replicas: 1, Attempts: 2, Charges: 1, Lost: 1,
			Faults: "pg_failover; replication=async",
			// the standby is held from the start; 1,1,1,1: attempt 1 claims,
			// charges and commits on the primary alone, and is answered 201;
			// pg_failover: the standby, which never received it, is promoted;
			// 2,2,2,2: attempt 2 finds no key there and charges again.
			Steps: moves(1, 1, 1, 1, lab.EventPGFailover, 2, 2, 2, 2),
			Shows: "PostgreSQL fails over under asynchronous replication: the old primary answered attempt 1's charge, the promoted standby never received it, so attempt 2 charges again — the client holds two charges, the surviving books one"},
		{Name: "pg-sync-loses-nothing", Case: "pg_failover_sync", Store: "postgres", Replicas: 1, Attempts: 2, Charges: 1,
			Faults: "pg_failover; replication=sync",
			// the same moves: attempt 1's commit waits for the standby
			// (blocked); pg_failover promotes the standby and fences the old
			// primary, so that commit fails unacknowledged and the store
			// tries again on the new primary (paused before its claim);
			// 2,2,2,2: attempt 2 charges once there; 1,1: attempt 1 finds
			// the completed key and replays it.
			Steps: moves(1, 1, 1, 1, lab.EventPGFailover, 2, 2, 2, 2, 1, 1),
			Shows: "the same moves under synchronous replication: attempt 1's commit waits for the standby and is never acknowledged; after the failover attempt 2 charges once and attempt 1, tried again, replays it — nothing a client was told of is lost"},
		{Name: "postgres-both-claim", Case: "replicas", Store: "postgres", Replicas: 2, Attempts: 2, Charges: 1,
			// 1,2: both before the claim; 1: attempt 1 inserts the key row
			// and pauses in its transaction; 2: attempt 2's INSERT blocks on
			// the unique index; 1,1: attempt 1 charges, then stores its
			// response and commits, which releases attempt 2; 2: attempt 2
			// reads the committed row and replays it.
			Steps: moves(1, 2, 1, 2, 1, 1, 2),
			Shows: "the same moves on PostgreSQL: attempt 2 waits on the unique index until attempt 1 commits, then replays its answer"},
		{Name: "lease-stale-worker-fenced", Case: "stale_worker", Store: "lease", Replicas: 1, Attempts: 2, Charges: 1,
			// 1,1: attempt 1 claims (token 1) and pauses in its work, a
			// stalled worker that renews nothing; lease: its lease ends;
			// 2,2: attempt 2 takes the key over (token 2); 2: it charges
			// and answers; 1: attempt 1 wakes and writes with token 1,
			// which the ledger refuses: it answers with attempt 2's charge.
			Steps: moves(1, 1, lease, 2, 2, 2, 1),
			Shows: "a worker stalls past its lease, a retry takes over, and the stalled worker's write is refused by the fence: one charge"},
		{Name: "phases-retry-resumes", Case: "crash_after_phase_2", Store: "phases", Replicas: 1, Attempts: 2, Charges: 1,
			Faults: "crash_after_phase=2; ttl_ms=60000",
			// 1,1: attempt 1 commits phase 1 (the claim, the request
			// recorded); 1: it commits phase 2 (the charge) and crashes;
			// lock: the key's lock ends; 2: attempt 2 arrives; 2: it takes
			// the key over at charge_created and runs phase 3 (the capture)
			// only; 2: phase 4 (the receipt event); 2: it answers 201.
			Steps: moves(1, 1, 1, lock, 2, 2, 2, 2),
			Shows: "a crash after the charge: the retry resumes at phase 3, not 1 — it captures under the charge's derived key and finishes with the one charge"},
		{Name: "phases-completer-finishes-first", Store: "phases", Replicas: 1, Attempts: 2, Charges: 1,
			Faults: "crash_after_phase=2; ttl_ms=60000",
			// the same crash; completer: the completer takes the key over
			// and runs phases 3 and 4; 2: attempt 2 arrives late; 2: it
			// finds the key finished; 2: it replays the completer's answer.
			Steps: moves(1, 1, 1, lab.EventCompleter, 2, 2, 2),
			Shows: "the same crash, and the client comes back late: the completer finished the key first, so the retry replays the charge it finished"},
	}
}

// FindSchedule is a named schedule.
func FindSchedule(name string) (Schedule, bool) {
	for _, s := range Schedules() {
		if s.Name == name {
			return s, true
		}
	}
	return Schedule{}, false
}
