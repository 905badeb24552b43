package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idempotency-lab/lab/lab/signature"
)

// Webhook event types.
const (
	EventCaptureProcessing = "capture.processing"
	EventCaptureSucceeded  = "capture.succeeded"
	EventCaptureFailed     = "capture.failed"
)

// WebhookEvent is the body of a webhook.
type WebhookEvent struct {
	ID      string      `json:"event_id"` // "evt_" + uuid
	Type    string      `json:"type"`
	Created int64       `json:"created"` // unix seconds
	Data    WebhookData `json:"data"`
}

// WebhookData describes the capture an event is about.
type WebhookData struct {
	CaptureID string `json:"capture_id"`
	// IdempotencyKey is the key of the capture call that made it, as a
	// real provider tells it: the caller can know its own capture from
	// the webhook alone, even before the call's answer reaches it.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	ChargeID       string `json:"charge_id"`
	Tenant         string `json:"tenant"`
	Run            string `json:"run"`
	AmountCents    int64  `json:"amount_cents"`
	Currency       string `json:"currency"`
	Status         string `json:"status"` // "processing", then the capture's status
}

// maxBackoff caps the wait between two attempts of one webhook.
const maxBackoff = time.Minute

// event builds one webhook event of a capture.
func event(typ, status string, c Capture, created int64) (id string, body []byte) {
	ev := WebhookEvent{ID: "evt_" + uuid.NewString(), Type: typ, Created: created, Data: WebhookData{
		CaptureID: c.ID, IdempotencyKey: c.Key, ChargeID: c.ChargeID, Tenant: c.Tenant, Run: c.Run,
		AmountCents: c.AmountCents, Currency: c.Currency, Status: status,
	}}
	body, _ = json.Marshal(ev) // strings and integers always marshal
	return ev.ID, body
}

// webhooks are the webhooks a new capture owes the lab, in the order they
// go, shaped by its faults: capture.processing, then capture.succeeded or
// capture.failed; the records keep them with the capture. None without a
// WebhookURL.
func (p *Provider) webhooks(c Capture, f Faults) []Webhook {
	if p.cfg.WebhookURL == "" {
		return nil
	}
	now := normalTime(p.cfg.Clock())
	due := now.Add(time.Duration(f.WebhookDelayMS) * time.Millisecond)
	hook := func(typ, status string) Webhook {
		id, body := event(typ, status, c, now.Unix())
		return Webhook{CaptureID: c.ID, EventID: id, Type: typ, ChargeID: c.ChargeID, Namespace: c.Namespace, Tenant: c.Tenant, Run: c.Run, Body: body,
			State: WebhookPending, NextAttempt: due, GiveUpAt: due.Add(p.cfg.WebhookWindow), CreatedAt: now}
	}
	processing := hook(EventCaptureProcessing, "processing")
	typ := EventCaptureSucceeded
	if c.Status == StatusFailed {
		typ = EventCaptureFailed
	}
	final := hook(typ, c.Status)
	var finals []Webhook
	if f.WebhookBadSignature {
		// The forged copy goes first: a receiver that acted on it would
		// then take the genuine event for a duplicate.
		forged := final
		forged.Forged = true
		finals = append(finals, forged)
	}
	finals = append(finals, final)
	if f.WebhookDuplicate {
		finals = append(finals, final)
	}
	var hooks []Webhook
	if f.WebhookReorder {
		hooks = append(finals, processing)
	} else {
		hooks = append([]Webhook{processing}, finals...)
	}
	for i := range hooks {
		hooks[i].Seq = i
	}
	return hooks
}

// wakeSender tells the webhooks' claim loop that a capture wrote some.
func (p *Provider) wakeSender() {
	select {
	case p.wake <- struct{}{}:
	default: // a wake-up is pending already: the claim that follows sees these too
	}
}

// sendWebhooks sends the records' due webhooks until ctx ends, up to
// WebhookWorkers at once: one loop claims as many due webhooks as senders
// are free and hands each to a sender of a fixed pool. The records hand
// out only the first pending webhook of each capture, so sends in flight
// together are of different captures, and a capture's webhooks still go
// in order. A webhook to try again later goes back to the records, due
// after its backoff: no sender waits one out, so one namespace's failing
// webhooks never hold up another's. With free senders the loop waits for
// a send to end (the next webhook of its capture may be due), a capture's
// wake-up, the soonest backoff it saw, or the poll; with none, for a send
// to end. On shutdown the senders release what they hold and stop.
func (p *Provider) sendWebhooks(ctx context.Context) {
	size := p.cfg.WebhookWorkers
	// Both hold at most size webhooks (busy counts them), so neither the
	// loop nor a sender ever blocks on them.
	jobs := make(chan Webhook, size)
	results := make(chan time.Time, size)
	var wg sync.WaitGroup
	defer wg.Wait()
	for range size {
		wg.Go(func() {
			for w := range jobs {
				if ctx.Err() != nil {
					p.release(ctx, w) // claimed, never tried
					results <- time.Time{}
					continue
				}
				results <- p.send(ctx, w)
			}
		})
	}
	defer close(jobs)

	t := time.NewTimer(0)
	defer t.Stop()
	busy := 0
	var soonest time.Time // the soonest retry a send scheduled, not yet claimed
	done := func(next time.Time) {
		busy--
		if !next.IsZero() && (soonest.IsZero() || next.Before(soonest)) {
			soonest = next
		}
	}
	for {
		if free := size - busy; free > 0 {
			now := p.cfg.Clock()
			for _, w := range p.claim(ctx, now, free) {
				jobs <- w
				busy++
			}
			if !soonest.After(now) {
				soonest = time.Time{} // due by this claim: claimed, or another process's now
			}
		}
		var timer <-chan time.Time
		wake := p.wake
		if busy < size {
			wait := p.cfg.WebhookPoll
			if !soonest.IsZero() {
				wait = max(min(wait, soonest.Sub(p.cfg.Clock())), 0)
			}
			t.Reset(wait)
			timer = t.C
		} else {
			wake = nil // no sender to take them: the wake-up waits for one
		}
		select {
		case <-ctx.Done():
			return
		case next := <-results:
			done(next)
			for drained := false; !drained; { // claim once for every send that ended meanwhile
				select {
				case next := <-results:
					done(next)
				default:
					drained = true
				}
			}
		case <-wake:
		case <-timer:
		}
	}
}

// claim leases up to limit due webhooks; a failure is logged and claims none.
func (p *Provider) claim(ctx context.Context, now time.Time, limit int) []Webhook {
	hooks, err := p.cfg.Records.ClaimWebhooks(ctx, now, limit, p.cfg.WebhookLease)
	if err != nil {
		if ctx.Err() == nil {
			p.cfg.Logger.WarnContext(ctx, "claiming webhooks failed", "err", err)
		}
		return nil
	}
	return hooks
}

// send makes one attempt of w and records it; it returns when w is due
// again, zero when it is delivered, dead or released.
func (p *Provider) send(ctx context.Context, w Webhook) time.Time {
	defer p.cfg.Signals.Counted.Signal()
	status, err := p.post(ctx, w)
	if ctx.Err() != nil {
		p.release(ctx, w)
		return time.Time{}
	}
	// The outcome is recorded even if the provider stops meanwhile.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	now := p.cfg.Clock()
	if err == nil && status >= 200 && status < 300 {
		p.counters.webhooksSent.Add(1)
		p.complete(ctx, w, p.cfg.Records.WebhookDelivered(rctx, w, now, status))
		return time.Time{}
	}
	reason := fmt.Sprintf("answered %d", status)
	if err != nil {
		reason = err.Error()
	} else {
		p.counters.webhooksRejected.Add(1)
	}
	next := now.Add(p.backoff(w.Attempts))
	var dead string
	switch {
	case err == nil && !retryable(status):
		dead = "an answer not worth retrying"
	case p.cfg.WebhookAttempts > 0 && w.Attempts >= p.cfg.WebhookAttempts:
		dead = "its attempts are spent"
	case next.After(w.GiveUpAt):
		dead = "its window is over"
	}
	if !p.complete(ctx, w, p.cfg.Records.WebhookFailed(rctx, w, next, dead != "", status, reason)) {
		return time.Time{}
	}
	if dead == "" {
		return next
	}
	p.counters.webhooksFailed.Add(1)
	level := p.cfg.Logger.WarnContext
	if w.Forged || err == nil {
		// The receiver answered and decided: a forged copy refused, or a
		// charge it does not hold (sent, then rolled back).
		level = p.cfg.Logger.InfoContext
	}
	level(ctx, "webhook dead: given up", "why", dead, "event_id", w.EventID, "type", w.Type, "capture_id", w.CaptureID,
		"forged", w.Forged, "attempts", w.Attempts, "status", status, "err", err)
	return time.Time{}
}

// release hands a claimed webhook back, due now: the provider stops, and
// the next Run on the records need not wait out the lease.
func (p *Provider) release(ctx context.Context, w Webhook) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	p.complete(ctx, w, p.cfg.Records.WebhookFailed(rctx, w, p.cfg.Clock(), false, 0, "interrupted: the provider stopped"))
}

// complete reports whether an attempt's outcome was recorded. When it was
// not, the webhook is sent again once its lease ends, which the receiver
// deduplicates by event id.
func (p *Provider) complete(ctx context.Context, w Webhook, err error) bool {
	switch {
	case errors.Is(err, ErrWebhookFenced):
		p.cfg.Logger.InfoContext(ctx, "webhook completion refused: claimed again or reset", "event_id", w.EventID, "capture_id", w.CaptureID)
		return false
	case err != nil:
		p.cfg.Logger.WarnContext(ctx, "recording a webhook's attempt failed; it is sent again after its lease", "event_id", w.EventID, "err", err)
		return false
	}
	return true
}

// refused says whether a webhook's last answer refused it as about a
// charge the receiver does not hold (404) or a capture it cannot place
// (409): retried, but waiting on something that may never come.
func refused(status int) bool {
	return status == http.StatusNotFound || status == http.StatusConflict
}

// retryable says whether an answer outside 2xx is worth another attempt:
// a 4xx is final, except 404 (the receiver may not know the charge yet),
// 409 and 429.
func retryable(status int) bool {
	if status >= 400 && status < 500 {
		return status == http.StatusNotFound || status == http.StatusConflict || status == http.StatusTooManyRequests
	}
	return true
}

// backoff is the wait after the attempt-th failure: doubling from
// WebhookBackoff up to maxBackoff, with jitter so that retries spread.
func (p *Provider) backoff(attempt int) time.Duration {
	d := p.cfg.WebhookBackoff << min(attempt-1, 20)
	if d <= 0 || d > maxBackoff {
		d = maxBackoff
	}
	return d/2 + time.Duration(p.cfg.Rand()*float64(d/2))
}

// post makes one attempt and returns the answer's status. The body is
// signed now: a signature is only good for a few minutes.
func (p *Provider) post(ctx context.Context, w Webhook) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.cfg.WebhookURL, bytes.NewReader(w.Body))
	if err != nil {
		return 0, fmt.Errorf("error building webhook %s: %w", w.EventID, err)
	}
	secret := p.cfg.Secret
	if w.Forged {
		secret = p.forged
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(signature.Header, signature.Sign(secret, p.cfg.Clock(), w.Body))
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("error sending webhook %s: %w", w.EventID, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	return resp.StatusCode, nil
}
