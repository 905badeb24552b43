// Package testsignal lets a test wait for the code under test to reach a
// named point, instead of sleeping or polling. The code calls Signal at
// the point; a zero Signal (what the lab runs with) does nothing, and one
// made by New, which only a test passes in, wakes the test's wait.
//
// Signals coalesce: a wait returns once the point was reached at least
// once since the previous wait returned. That is what a test needs to
// re-check a condition each time the code may have changed it (WaitUntil),
// and it means the code never blocks on a test that is not waiting.
package testsignal

import "time"

// Timeout bounds every wait: long enough for a loaded machine, short
// enough that a point never reached fails the test rather than hangs it.
const Timeout = 30 * time.Second

// TB is the part of testing.TB a wait uses (so the lab's own code does
// not import package testing).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Signal is one named point of the code under test.
type Signal struct {
	c chan struct{}
}

// New returns a Signal a test can wait on.
func New() Signal { return Signal{c: make(chan struct{}, 1)} }

// Signal notes that the point was reached. It never blocks, and does
// nothing on a zero Signal.
func (s Signal) Signal() {
	if s.c == nil {
		return
	}
	select {
	case s.c <- struct{}{}:
	default: // a wake-up is already pending: the waiter will look anyway
	}
}

// WaitOrTimeout waits until the point is reached (once since the last
// wait), failing the test after Timeout.
func (s Signal) WaitOrTimeout(tb TB, what string) {
	tb.Helper()
	if s.c == nil {
		tb.Fatalf("waiting for %s on a signal no test armed (make it with testsignal.New)", what)
		return
	}
	t := time.NewTimer(Timeout)
	defer t.Stop()
	select {
	case <-s.c:
	case <-t.C:
		tb.Fatalf("%s: not signalled within %s", what, Timeout)
	}
}

// WaitUntil waits until cond holds: it checks cond, then again each time
// the code signals, failing the test when Timeout passes with cond false.
func (s Signal) WaitUntil(tb TB, what string, cond func() bool) {
	tb.Helper()
	if s.c == nil {
		tb.Fatalf("waiting for %s on a signal no test armed (make it with testsignal.New)", what)
		return
	}
	t := time.NewTimer(Timeout)
	defer t.Stop()
	for !cond() {
		select {
		case <-s.c:
		case <-t.C:
			if !cond() {
				tb.Fatalf("%s: never, within %s", what, Timeout)
			}
			return
		}
	}
}
