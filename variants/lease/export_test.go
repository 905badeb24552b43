package lease

import (
	"testing"

	"github.com/idempotency-lab/lab/lab/testsignal"
)

// Signals are a store's named points, armed for a test.
type Signals struct{ s *Store }

// ArmSignals makes s signal its named points; call it before any Charge.
func ArmSignals(s *Store) *Signals {
	s.signals.claimed = testsignal.NewValues[int64](16)
	s.signals.renewing = testsignal.NewValues[int64](16)
	return &Signals{s}
}

// WaitClaimed waits until an attempt's phase one committed, and returns
// the token it won.
func (g *Signals) WaitClaimed(t testing.TB) int64 {
	t.Helper()
	return g.s.signals.claimed.Wait(t, "a committed claim")
}

// Renewing returns the tokens whose heartbeat started so far.
func (g *Signals) Renewing() []int64 { return g.s.signals.renewing.Taken() }
