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
	want := []PhaseAt{{"db", 2.5, ""}, {"app", 3.5, "y"}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := ParseServerTiming(""); len(got) != 0 {
		t.Fatalf("empty header: %v", got)
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
	got := ParseServerTiming(p.ServerTiming())
	if len(got) != 3 || got[1].Name != PhaseFenced || got[1].Detail != `write refused: token 7 < 8; "stale", by one` || got[0].Detail != "" || got[2].Name != PhaseReplay {
		t.Fatalf("got %+v from %q", got, p.ServerTiming())
	}
}
