package prune

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/testsignal"
	"go.uber.org/goleak"
)

// rows is a fake table of prunable rows, each its age.
type rows struct {
	mu    sync.Mutex
	ages  []time.Time // oldest first
	calls []int       // what each prune call deleted
	// pruned is signalled after each call: the test waits on it.
	pruned testsignal.Signal
}

func (r *rows) prune(_ context.Context, before time.Time, limit int) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for n < len(r.ages) && n < limit && r.ages[n].Before(before) {
		n++
	}
	r.ages = r.ages[n:]
	r.calls = append(r.calls, n)
	r.pruned.Signal()
	return n, nil
}

// TestPruneAllInBatches: one pass deletes in batches until one comes back
// short, and leaves the rows younger than the cutoff.
func TestPruneAllInBatches(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	r := &rows{}
	for i := range 2500 {
		r.ages = append(r.ages, t0.Add(time.Duration(i)*time.Second))
	}
	n, err := All(t.Context(), r.prune, t0.Add(2200*time.Second), 1000)
	if err != nil || n != 2200 || !slices.Equal(r.calls, []int{1000, 1000, 200}) || len(r.ages) != 300 {
		t.Fatalf("pruned %d (%v) in calls %v, %d left; want 2200 in [1000 1000 200], 300 left", n, err, r.calls, len(r.ages))
	}
	if n, _ := All(t.Context(), r.prune, t0.Add(2200*time.Second), 1000); n != 0 {
		t.Fatalf("a second pass pruned %d, want none", n)
	}
}

// TestPrunerStopsOnShutdown: the pruner prunes every interval, and returns
// once its context ends, leaving no goroutine behind.
func TestPrunerStopsOnShutdown(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	r := &rows{ages: []time.Time{t0, t0.Add(time.Hour)}, pruned: testsignal.New()}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, time.Millisecond, func() time.Time { return t0.Add(time.Minute) },
			[]Target{{"rows", r.prune}}, slog.New(slog.DiscardHandler))
	}()
	var left int
	r.pruned.WaitUntil(t, "two passes of the pruner", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		left = len(r.ages)
		return len(r.calls) >= 2
	})
	if left != 1 {
		t.Fatalf("%d rows left, want the younger one", left)
	}
	cancel()
	testsignal.Receive(t, "the pruner stopping as its context ended", done)
}
