package testsignal_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/testsignal"
)

// recorder is a test whose failure is noted instead of taken.
type recorder struct{ failed string }

func (r *recorder) Helper()                        {}
func (r *recorder) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }

// TestZeroSignalDoesNothing: the lab's own (zero) signals never block, and
// a wait on one fails at once, naming what it waited for.
func TestZeroSignalDoesNothing(t *testing.T) {
	var s testsignal.Signal
	for range 3 {
		s.Signal()
	}
	var r recorder
	s.WaitOrTimeout(&r, "the point")
	if r.failed == "" {
		t.Fatal("a wait on a signal no test armed did not fail")
	}
}

// TestSignalsCoalesce: signals sent before a wait wake it once, and the
// code never blocks however often it signals.
func TestSignalsCoalesce(t *testing.T) {
	s := testsignal.New()
	for range 1000 {
		s.Signal()
	}
	s.WaitOrTimeout(t, "the first signal")
	done := make(chan struct{})
	go func() {
		s.Signal()
		close(done)
	}()
	<-done
	s.WaitOrTimeout(t, "a signal sent after the first wait")
}

// TestWaitUntil re-checks its condition on each signal, and returns
// without waiting when it already holds.
func TestWaitUntil(t *testing.T) {
	s := testsignal.New()
	s.WaitUntil(t, "a condition already true", func() bool { return true })
	var n atomic.Int32
	go func() {
		for range 5 {
			n.Add(1)
			s.Signal()
		}
	}()
	s.WaitUntil(t, "five steps", func() bool { return n.Load() == 5 })
}

// TestValuesKeepEachValue: every value sent reaches the test, in order;
// zero Values neither block nor keep anything.
func TestValuesKeepEachValue(t *testing.T) {
	var zero testsignal.Values[int]
	zero.Send(1)
	if got := zero.Taken(); len(got) != 0 {
		t.Fatalf("zero values kept %v", got)
	}
	p := testsignal.NewValues[int](4)
	for i := range 3 {
		p.Send(i)
	}
	if v := p.Wait(t, "the first value"); v != 0 {
		t.Fatalf("first value %d, want 0", v)
	}
	if got := p.Taken(); fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("then %v, want [1 2]", got)
	}
}

// deadlined is a test whose binary ends at a given time.
type deadlined struct {
	recorder
	end time.Time
}

func (d *deadlined) Deadline() (time.Time, bool) { return d.end, true }

// TestWaitsEndWithTheBinarysDeadline: a wait has no clock of its own. It
// gives up only as the test binary's deadline nears, failing its test
// with what it waited for; without a deadline it never gives up.
func TestWaitsEndWithTheBinarysDeadline(t *testing.T) {
	near := &deadlined{end: time.Now().Add(time.Minute + 50*time.Millisecond)} // Expiry leaves a minute
	testsignal.New().WaitOrTimeout(near, "a point never reached")
	if !strings.Contains(near.failed, "a point never reached") {
		t.Fatalf("the wait ended with %q, want a failure naming what it waited for", near.failed)
	}
	var r recorder // no deadline
	if expired, stop := testsignal.Expiry(&r); expired != nil {
		stop()
		t.Fatal("a test without a deadline got an expiry")
	}
}
