package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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
	CaptureID   string `json:"capture_id"`
	ChargeID    string `json:"charge_id"`
	Tenant      string `json:"tenant"`
	Run         string `json:"run"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Status      string `json:"status"` // "processing", then the capture's status
}

// webhookJob is what is left to send of one capture's webhooks, in order;
// attempt counts the tries of the first one.
type webhookJob struct {
	sends   []webhookSend
	attempt int
}

type webhookSend struct {
	id, typ string
	body    []byte
	forged  bool // signed with a wrong secret
}

// maxBackoff caps the wait between two attempts of one webhook.
const maxBackoff = time.Minute

func (p *Provider) webhook(typ, status string, c Capture, created int64) webhookSend {
	ev := WebhookEvent{ID: "evt_" + uuid.NewString(), Type: typ, Created: created, Data: WebhookData{
		CaptureID: c.ID, ChargeID: c.ChargeID, Tenant: c.Tenant, Run: c.Run,
		AmountCents: c.AmountCents, Currency: c.Currency, Status: status,
	}}
	body, _ := json.Marshal(ev) // strings and integers always marshal
	return webhookSend{id: ev.ID, typ: typ, body: body}
}

// enqueueWebhooks queues a new capture's webhooks, shaped by its faults:
// capture.processing, then capture.succeeded or capture.failed.
func (p *Provider) enqueueWebhooks(ctx context.Context, c Capture, f Faults) {
	if p.cfg.WebhookURL == "" {
		return
	}
	created := p.cfg.Clock().Unix()
	processing := p.webhook(EventCaptureProcessing, "processing", c, created)
	typ := EventCaptureSucceeded
	if c.Status == StatusFailed {
		typ = EventCaptureFailed
	}
	final := p.webhook(typ, c.Status, c, created)
	var finals []webhookSend
	if f.WebhookBadSignature {
		// The forged copy goes first: a receiver that acted on it would
		// then take the genuine event for a duplicate.
		forged := final
		forged.forged = true
		finals = append(finals, forged)
	}
	finals = append(finals, final)
	if f.WebhookDuplicate {
		finals = append(finals, final)
	}
	var sends []webhookSend
	if f.WebhookReorder {
		sends = append(finals, processing)
	} else {
		sends = append([]webhookSend{processing}, finals...)
	}
	p.queueMu.Lock()
	defer p.queueMu.Unlock()
	if p.closed {
		p.counters.webhooksDropped.Add(int64(len(sends)))
		p.cfg.Logger.InfoContext(ctx, "provider stopped: webhooks dropped", "capture_id", c.ID, "webhooks", len(sends))
		return
	}
	select {
	case p.queue <- webhookJob{sends: sends}:
	default:
		p.counters.webhooksDropped.Add(int64(len(sends)))
		p.cfg.Logger.WarnContext(ctx, "webhook queue full: webhooks dropped", "capture_id", c.ID, "webhooks", len(sends))
	}
}

// sendWebhooks is one worker: it sends a job's webhooks in order. A
// webhook to try again later goes back, with what follows it, to the queue
// after its backoff: no worker ever waits out a backoff, so one namespace's
// failing webhooks never hold up another's.
func (p *Provider) sendWebhooks(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-p.queue:
			p.sendJob(ctx, j)
		}
	}
}

// sendJob sends j's webhooks until one has to wait for another attempt.
func (p *Provider) sendJob(ctx context.Context, j webhookJob) {
	for len(j.sends) > 0 {
		s := j.sends[0]
		j.attempt++
		status, err := p.post(ctx, s)
		switch {
		case ctx.Err() != nil:
			p.dropSends(ctx, len(j.sends), s.id)
			return
		case err == nil && status >= 200 && status < 300:
			p.counters.webhooksSent.Add(1)
		case err == nil && !retryable(status), j.attempt >= p.cfg.WebhookAttempts:
			if err == nil {
				p.counters.webhooksRejected.Add(1)
			}
			p.counters.webhooksFailed.Add(1)
			level := p.cfg.Logger.WarnContext
			if s.forged || err == nil {
				// The receiver answered and decided: a forged copy refused,
				// or a charge it does not hold (sent, then rolled back).
				level = p.cfg.Logger.InfoContext
			}
			level(ctx, "webhook given up", "event_id", s.id, "type", s.typ, "forged", s.forged,
				"attempts", j.attempt, "status", status, "err", err)
		default:
			if err == nil {
				p.counters.webhooksRejected.Add(1)
			}
			p.later(ctx, j, p.backoff(j.attempt))
			return
		}
		j = webhookJob{sends: j.sends[1:]}
	}
}

// later puts j back in the queue after d, unless the provider stopped.
func (p *Provider) later(ctx context.Context, j webhookJob, d time.Duration) {
	p.queueMu.Lock()
	defer p.queueMu.Unlock()
	if p.closed {
		p.dropLocked(ctx, len(j.sends), j.sends[0].id)
		return
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		p.queueMu.Lock()
		defer p.queueMu.Unlock()
		delete(p.waiting, t)
		if p.closed {
			p.dropLocked(ctx, len(j.sends), j.sends[0].id)
			return
		}
		select {
		case p.queue <- j:
		default:
			p.counters.webhooksDropped.Add(int64(len(j.sends)))
			p.cfg.Logger.WarnContext(context.WithoutCancel(ctx), "webhook queue full: webhooks dropped", "event_id", j.sends[0].id, "webhooks", len(j.sends))
		}
	})
	p.waiting[t] = len(j.sends)
}

func (p *Provider) dropSends(ctx context.Context, n int, id string) {
	p.queueMu.Lock()
	defer p.queueMu.Unlock()
	p.dropLocked(ctx, n, id)
}

// dropLocked counts webhooks never sent because the provider stopped.
func (p *Provider) dropLocked(ctx context.Context, n int, id string) {
	p.counters.webhooksDropped.Add(int64(n))
	p.cfg.Logger.InfoContext(context.WithoutCancel(ctx), "provider stopped: webhooks dropped", "event_id", id, "webhooks", n)
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

// post makes one attempt and returns the answer's status.
func (p *Provider) post(ctx context.Context, s webhookSend) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.cfg.WebhookURL, bytes.NewReader(s.body))
	if err != nil {
		return 0, fmt.Errorf("error building webhook %s: %w", s.id, err)
	}
	secret := p.cfg.Secret
	if s.forged {
		secret = p.forged
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(signature.Header, signature.Sign(secret, p.cfg.Clock(), s.body))
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("error sending webhook %s: %w", s.id, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	return resp.StatusCode, nil
}
