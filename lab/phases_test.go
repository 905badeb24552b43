package lab

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestServerTimingRoundTrip(t *testing.T) {
	arrival := time.Now().Add(-5 * time.Millisecond)
	p := NewPhases(arrival)
	ctx := WithPhases(context.Background(), p)
	Mark(ctx, PhaseClaim)
	Mark(ctx, PhaseCharge)
	Mark(ctx, PhaseCommit)
	Mark(context.Background(), PhaseReplay) // no recorder: nothing happens
	at, got := ParseServerTiming(p.ServerTiming())
	if !at.Equal(time.UnixMicro(arrival.UnixMicro())) {
		t.Errorf("arrival %v from %q, want %v to the microsecond", at, p.ServerTiming(), arrival)
	}
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

// A commit is marked as it is sent and recorded once it succeeded: it
// keeps its instant, before a replay recorded meanwhile, and one never
// recorded (the write failed) is no phase.
func TestMarkBeforeKeepsItsInstant(t *testing.T) {
	p := NewPhases(time.Now())
	ctx := WithPhases(context.Background(), p)
	commit := MarkBefore(ctx, PhaseCommit)
	MarkBefore(ctx, PhaseCharge) // its write failed: never recorded
	Mark(ctx, PhaseReplay)
	commit()
	_, got := ParseServerTiming(p.ServerTiming())
	if len(got) != 2 || got[0].Name != PhaseCommit || got[1].Name != PhaseReplay {
		t.Fatalf("got %+v from %q, want the commit, then the replay", got, p.ServerTiming())
	}
	MarkBefore(context.Background(), PhaseCommit)() // no recorder: nothing happens
}

func TestParseServerTimingSkipsWhatItCannotRead(t *testing.T) {
	at, got := ParseServerTiming(`cache;desc="hit", db;dur=2.5, x;dur=oops, arrival;desc=soon, app;dur=1;desc=y`)
	want := []PhaseAt{{"db", 2.5, ""}, {"app", 3.5, "y"}}
	if !slices.Equal(got, want) || !at.IsZero() {
		t.Fatalf("got %v arriving %v, want %v and no arrival", got, at, want)
	}
	if at, got := ParseServerTiming(""); len(got) != 0 || !at.IsZero() {
		t.Fatalf("empty header: %v, %v", got, at)
	}
}

// A detail survives the header whatever it holds: the separators of the
// header's own syntax included.
func TestServerTimingCarriesDetails(t *testing.T) {
	p := NewPhases(time.Now())
	ctx := WithPhases(context.Background(), p)
	Mark(ctx, PhaseClaim)
	MarkDetail(ctx, PhaseFenced, `write refused: token 7 < 8; "stale", by one`)
	Mark(ctx, PhaseReplay)
	_, got := ParseServerTiming(p.ServerTiming())
	if len(got) != 3 || got[1].Name != PhaseFenced || got[1].Detail != `write refused: token 7 < 8; "stale", by one` || got[0].Detail != "" || got[2].Name != PhaseReplay {
		t.Fatalf("got %+v from %q", got, p.ServerTiming())
	}
}
