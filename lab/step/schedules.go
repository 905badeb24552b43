package step

import (
	"strconv"
	"strings"

	"github.com/idempotency-lab/lab/lab"
)

// Schedule is a named interleaving: which attempt moves at each step, and
// the outcome it gives every time.
type Schedule struct {
	Name     string        `json:"name"`
	Store    lab.StoreName `json:"store"`
	Replicas int           `json:"replicas"`
	Attempts int           `json:"attempts"`
	Steps    []int         `json:"steps"`
	Charges  int           `json:"charges"` // ledger entries it leaves for the key
	Shows    string        `json:"shows"`
}

// Schedules are the named schedules, one per cell of the lesson that has
// one. The store names are the variants' own.
func Schedules() []Schedule {
	return []Schedule{
		{Name: "look-first-both-look", Store: "look-first", Replicas: 1, Attempts: 2, Charges: 2,
			// 1,2: both at before_claim; 1,2: both looked and found nothing;
			// 1,1: attempt 1 charges and answers; 2,2: so does attempt 2.
			Steps: []int{1, 2, 1, 2, 1, 1, 2, 2},
			Shows: "both look, then both write: each found nothing, so each charged — the check and the act are two steps"},
		{Name: "look-first-one-after-the-other", Store: "look-first", Replicas: 1, Attempts: 2, Charges: 1,
			// attempt 1 looks, charges and answers; attempt 2 then looks and replays.
			Steps: []int{1, 1, 1, 1, 2, 2},
			Shows: "one looks and writes, then the other looks: it finds the answer and replays — the same design, decided by the interleaving alone"},
		{Name: "memory-both-claim", Store: "memory", Replicas: 2, Attempts: 2, Charges: 2,
			// each attempt claims in its own replica's map before either completes.
			Steps: []int{1, 2, 1, 2, 1, 1, 2, 2},
			Shows: "both claim before either completes, on two replicas: each replica's map said yes, and each charged"},
		{Name: "postgres-both-claim", Store: "postgres", Replicas: 2, Attempts: 2, Charges: 1,
			// 1,2: both before the claim; 1: attempt 1 inserts the key row
			// and pauses in its transaction; 2: attempt 2's INSERT blocks on
			// the unique index; 1,1: attempt 1 charges, then stores its
			// response and commits, which releases attempt 2; 2: attempt 2
			// reads the committed row and replays it.
			Steps: []int{1, 2, 1, 2, 1, 1, 2},
			Shows: "the same moves on PostgreSQL: attempt 2 waits on the unique index until attempt 1 commits, then replays its answer"},
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

// ParseSteps reads a schedule such as "2,1,1,2" for a run of n attempts.
func ParseSteps(raw string, n int) ([]int, error) {
	if raw == "" {
		return nil, lab.Invalid("schedule", "must list attempts such as 1,2,1,2")
	}
	parts := strings.Split(raw, ",")
	if len(parts) > 64*MaxAttempts {
		return nil, lab.Invalid("schedule", "must have at most %d moves (got %d)", 64*MaxAttempts, len(parts))
	}
	steps := make([]int, 0, len(parts))
	for _, p := range parts {
		a, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || a < 1 || a > n {
			return nil, lab.Invalid("schedule", "each move must be an attempt in 1..%d (got %q)", n, p)
		}
		steps = append(steps, a)
	}
	return steps, nil
}
