package lease

// Named points of the charge path a test can wait on instead of sleeping
// or polling (as River's testsignal): the store signals a point only when a
// test armed it (export_test.go), so outside tests a signal is one nil check.

// testSignal is one named point, carrying a value.
type testSignal[T any] struct{ ch chan T }

// signal sends v to the test that armed the point; unarmed, it does nothing.
func (p *testSignal[T]) signal(v T) {
	if p.ch == nil {
		return
	}
	select {
	case p.ch <- v:
	default:
		panic("lease: a test signal's buffer is full: the test armed it and stopped waiting on it")
	}
}

// signals are the store's named points.
type signals struct {
	claimed  testSignal[int64] // phase one committed: the token won
	renewing testSignal[int64] // the heartbeat started for the token
}
