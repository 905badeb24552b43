package memory

import (
	"context"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// twinWait is an attempt's bounded wait for an in-flight twin, on both
// paths. It starts with the attempt's first wait (a first attempt or a
// replay needs none) and lasts across its rounds. lab.WaitBound makes it,
// so a stepped run's "wait" move ends it as the bound's end would.
type twinWait struct {
	ctx  context.Context // nil until the first wait
	stop context.CancelFunc
}

// done starts the wait if need be; it is closed when the bound runs out or
// the caller leaves.
func (w *twinWait) done(ctx context.Context, d time.Duration) <-chan struct{} {
	if w.ctx == nil {
		w.ctx, w.stop = lab.WaitBound(ctx, d)
	}
	return w.ctx.Done()
}

// end stops the wait's timer.
func (w *twinWait) end() {
	if w.stop != nil {
		w.stop()
	}
}

// waitOver is the answer once the wait is done: the caller's error if it
// left, else 409, as the design answers a twin still in flight.
func waitOver(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return &lab.InProgressError{RetryAfter: time.Second}
}
