package inmem

import (
	"context"
	"slices"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// PruneDelivered deletes at most limit events delivered before before,
// oldest first, and adds what they counted for to the roll-up under the
// same lock, as the PostgreSQL books do in one statement. Pending and dead
// events stay. It returns how many it deleted.
func (b *Books) PruneDelivered(_ context.Context, before time.Time, limit int) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var old []*lab.Event
	for _, ev := range b.events {
		if ev.State == lab.EventDelivered && ev.DeliveredAt.Before(before) {
			old = append(old, ev)
		}
	}
	slices.SortStableFunc(old, func(x, y *lab.Event) int { return x.DeliveredAt.Compare(y.DeliveredAt) })
	old = old[:min(len(old), limit)]
	gone := map[*lab.Event]bool{}
	for _, ev := range old {
		k := runKey{ev.Namespace, ev.Run}
		if b.pruned[k] == nil {
			b.pruned[k] = &rollup{}
		}
		b.pruned[k].delivered++
		b.pruned[k].retries += max(ev.Attempts-1, 0)
		delete(b.byID, ev.ID)
		gone[ev] = true
	}
	b.events = slices.DeleteFunc(b.events, func(ev *lab.Event) bool { return gone[ev] })
	return len(old), nil
}

// PruneWebhookEvents forgets at most limit of the provider event ids
// processed before before, oldest first, and returns how many. One that
// did not match its charge is kept: reconcile reports it.
func (b *Books) PruneWebhookEvents(_ context.Context, before time.Time, limit int) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	type old struct {
		id string
		at time.Time
	}
	var found []old
	for id, w := range b.webhooks {
		if w.mismatch == "" && w.receivedAt.Before(before) {
			found = append(found, old{id, w.receivedAt})
		}
	}
	slices.SortFunc(found, func(x, y old) int { return x.at.Compare(y.at) })
	found = found[:min(len(found), limit)]
	for _, o := range found {
		delete(b.webhooks, o.id)
	}
	return len(found), nil
}
