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

// TB is the part of testing.TB a wait uses (so the lab's own code does
// not import package testing).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// margin is what a wait leaves of the test binary's time: enough for the
// test to fail with its reason and clean up what it started.
const margin = time.Minute

// Expiry fires when a wait of tb gives up: shortly before the test
// binary's deadline (go test -timeout), the suite's one clock. A wait has
// no clock of its own, so a loaded machine only makes it longer, while a
// point never reached still fails its own test, naming what it waited
// for, rather than the binary with a stack dump. Without a deadline (a
// plain testing.TB, or -timeout 0) it never fires. stop releases it.
func Expiry(tb TB) (expired <-chan time.Time, stop func()) {
	d, ok := tb.(interface{ Deadline() (time.Time, bool) })
	if !ok {
		return nil, func() {}
	}
	deadline, ok := d.Deadline()
	if !ok {
		return nil, func() {}
	}
	t := time.NewTimer(time.Until(deadline.Add(-margin)))
	return t.C, func() { t.Stop() }
}

// Receive takes the next value from c, failing the test when none comes
// before Expiry.
func Receive[T any](tb TB, what string, c <-chan T) T {
	tb.Helper()
	expired, stop := Expiry(tb)
	defer stop()
	var v T
	select {
	case v = <-c:
	case <-expired:
		tb.Fatalf("%s: never came, and the test binary's deadline is near", what)
	}
	return v
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
// wait), failing the test at Expiry.
func (s Signal) WaitOrTimeout(tb TB, what string) {
	tb.Helper()
	receive(tb, what, s.c, "a signal no test armed (make it with testsignal.New)")
}

// receive takes the next value from c, failing the test when c is nil
// (unarmed) or nothing comes before Expiry.
func receive[T any](tb TB, what string, c chan T, unarmed string) T {
	tb.Helper()
	if c == nil {
		tb.Fatalf("waiting for %s on %s", what, unarmed)
		var zero T
		return zero
	}
	return Receive(tb, what, c)
}

// WaitUntil waits until cond holds: it checks cond, then again each time
// the code signals, failing the test at Expiry with cond false.
func (s Signal) WaitUntil(tb TB, what string, cond func() bool) {
	tb.Helper()
	if s.c == nil {
		tb.Fatalf("waiting for %s on a signal no test armed (make it with testsignal.New)", what)
		return
	}
	expired, stop := Expiry(tb)
	defer stop()
	for !cond() {
		select {
		case <-s.c:
		case <-expired:
			if !cond() {
				tb.Fatalf("%s: never, and the test binary's deadline is near", what)
			}
			return
		}
	}
}

// Values is a named point that hands the test a value each time it is
// reached (the token a claim won, say). Unlike a Signal it does not
// coalesce: every value reaches the test, in order.
type Values[T any] struct {
	c chan T
}

// NewValues returns Values a test can wait on, holding up to n values the
// test has not taken yet.
func NewValues[T any](n int) Values[T] { return Values[T]{c: make(chan T, n)} }

// Send hands v to the test; on zero Values it does nothing. Once n values
// wait untaken it panics: the test armed the point and stopped taking them.
func (p Values[T]) Send(v T) {
	if p.c == nil {
		return
	}
	select {
	case p.c <- v:
	default:
		panic("testsignal: a point's values are full: the test armed it and stopped taking them")
	}
}

// Wait returns the next value, failing the test at Expiry.
func (p Values[T]) Wait(tb TB, what string) T {
	tb.Helper()
	return receive(tb, what, p.c, "values no test armed (make them with testsignal.NewValues)")
}

// Taken returns the values sent and not yet taken, without waiting.
func (p Values[T]) Taken() []T {
	var out []T
	for {
		select {
		case v := <-p.c:
			out = append(out, v)
		default:
			return out
		}
	}
}
