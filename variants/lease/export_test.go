package lease

import (
	"testing"
	"time"
)

// Signals are a store's named points, armed for a test.
type Signals struct{ s *Store }

// ArmSignals makes s signal its named points; call it before any Charge.
func ArmSignals(s *Store) *Signals {
	s.signals.claimed.ch = make(chan int64, 16)
	s.signals.renewing.ch = make(chan int64, 16)
	return &Signals{s}
}

// WaitClaimed waits until an attempt's phase one committed, and returns
// the token it won; the test fails after 10 seconds without one.
func (g *Signals) WaitClaimed(t testing.TB) int64 {
	t.Helper()
	select {
	case token := <-g.s.signals.claimed.ch:
		return token
	case <-time.After(10 * time.Second):
		t.Fatal("no claim was committed within 10s")
		return 0
	}
}

// Renewing drains the tokens whose heartbeat started so far.
func (g *Signals) Renewing() []int64 {
	var tokens []int64
	for {
		select {
		case token := <-g.s.signals.renewing.ch:
			tokens = append(tokens, token)
		default:
			return tokens
		}
	}
}
