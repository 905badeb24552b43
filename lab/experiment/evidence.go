package experiment

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/idempotency-lab/lab/lab"
)

// evidence is what a run saw, from which its explanation is written: every
// claim the text makes is one of these figures.
type evidence struct {
	keyless    bool           // the design keeps no key at all
	prior      int            // the key's charges before the run
	added      int            // ledger rows the run added
	keyBefore  string         // the store's view of the key when the run began
	replays    int            // answers replayed from the store
	inProgress int            // 409 idempotency_in_progress answers
	rejected   int            // 422 answers: the key was first used with another request
	freshBy    map[string]int // fresh 201 answers (charges) per replica
}

// freshByReplica counts the attempts answered with a new charge, per replica.
func freshByReplica(timeline []Result) map[string]int {
	out := map[string]int{}
	for _, res := range timeline {
		if f := res.Final(); f.Status == http.StatusCreated && !f.Replayed {
			out[cmp.Or(res.Replica, res.Target)]++
		}
	}
	return out
}

// answers sums up the answers that charged nothing.
func (e evidence) answers() string {
	var parts []string
	if e.replays > 0 {
		parts = append(parts, fmt.Sprintf("%d replayed the stored response", e.replays))
	}
	if e.inProgress > 0 {
		parts = append(parts, fmt.Sprintf("%d got 409 while another was in flight", e.inProgress))
	}
	if e.rejected > 0 {
		parts = append(parts, fmt.Sprintf("%d got 422: the key was first used with another request", e.rejected))
	}
	if len(parts) == 0 {
		return "no attempt was answered from the store"
	}
	return strings.Join(parts, ", ")
}

// onChargedKey explains a run on a key that already had charges: it says so
// first, then what the run added and why, from the evidence alone.
func (e evidence) onChargedKey() string {
	head := fmt.Sprintf("This key was charged before this run (%d charge(s) in the ledger)", e.prior)
	if e.added == 0 {
		return fmt.Sprintf("%s and the store still knew it (%s): the run added nothing; %s", head, e.keyBefore, e.answers())
	}
	var who []string
	for _, r := range slices.Sorted(maps.Keys(e.freshBy)) {
		who = append(who, fmt.Sprintf("%s charged %d", r, e.freshBy[r]))
	}
	why := "the replica that served the charging attempts did not know the key"
	switch {
	case e.keyless:
		why = "this design keeps no key"
	case e.keyBefore == lab.KeyAbsent:
		why = "the store no longer held the key (it expired, was forgotten by a restart or a crash, or its record was never written)"
	case len(e.freshBy) > 1:
		why = "several replicas charged it: each one that did had no record of the key"
	}
	text := fmt.Sprintf("%s, but %s, so the run charged %d more (%s)", head, why, e.added, strings.Join(who, ", "))
	if rest := e.answers(); e.replays+e.inProgress+e.rejected > 0 {
		text += "; " + rest
	}
	return text
}
