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

// webhookJob is one capture's webhooks, sent in order by one worker.
type webhookJob struct{ sends []webhookSend }

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

// sendWebhooks is one worker: it sends each job's webhooks in order,
// until ctx ends.
func (p *Provider) sendWebhooks(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-p.queue:
			for i, s := range j.sends {
				if !p.deliver(ctx, s) {
					left := len(j.sends) - i
					p.counters.webhooksDropped.Add(int64(left))
					p.cfg.Logger.InfoContext(context.WithoutCancel(ctx), "provider stopped: webhooks dropped", "event_id", s.id, "webhooks", left)
					return
				}
			}
		}
	}
}

// deliver sends one webhook until it is accepted or given up; it reports
// false when ctx ended first.
func (p *Provider) deliver(ctx context.Context, s webhookSend) bool {
	for attempt := 1; ; attempt++ {
		status, err := p.post(ctx, s)
		if ctx.Err() != nil {
			return false
		}
		if err == nil && status >= 200 && status < 300 {
			p.counters.webhooksSent.Add(1)
			return true
		}
		if err == nil {
			p.counters.webhooksRejected.Add(1)
		}
		if (err == nil && !retryable(status)) || attempt >= p.cfg.WebhookAttempts {
			p.counters.webhooksFailed.Add(1)
			level := p.cfg.Logger.WarnContext
			if s.forged || err == nil {
				// The receiver answered and decided: a forged copy refused,
				// or a charge it does not hold (sent, then rolled back).
				level = p.cfg.Logger.InfoContext
			}
			level(ctx, "webhook given up", "event_id", s.id, "type", s.typ, "forged", s.forged,
				"attempts", attempt, "status", status, "err", err)
			return true
		}
		t := time.NewTimer(p.backoff(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
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
