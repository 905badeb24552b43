package lab

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestServerTimingRoundTrip(t *testing.T) {
	p := NewPhases(time.Now().Add(-5 * time.Millisecond))
	ctx := WithPhases(context.Background(), p)
	Mark(ctx, PhaseClaim)
	Mark(ctx, PhaseCharge)
	Mark(ctx, PhaseCommit)
	Mark(context.Background(), PhaseReplay) // no recorder: nothing happens
	got := ParseServerTiming(p.ServerTiming())
	var names []string
	for i, g := range got {
		names = append(names, g.Name)
		if g.AtMS < 5 || i > 0 && g.AtMS < got[i-1].AtMS {
			t.Errorf("phase %s at %.3f ms: want after the arrival 5 ms before, in order (%v)", g.Name, g.AtMS, got)
		}
	}
	if !slices.Equal(names, []string{PhaseClaim, PhaseCharge, PhaseCommit}) {
		t.Fatalf("phases %v from %q", names, p.ServerTiming())
	}
}

func TestParseServerTimingSkipsWhatItCannotRead(t *testing.T) {
	got := ParseServerTiming(`cache;desc="hit", db;dur=2.5, x;dur=oops, app;dur=1;desc=y`)
	want := []PhaseAt{{"db", 2.5}, {"app", 3.5}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := ParseServerTiming(""); len(got) != 0 {
		t.Fatalf("empty header: %v", got)
	}
}
