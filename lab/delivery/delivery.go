// Package delivery carries a charge's effects to the payment provider over
// HTTP: the capture, keyed so that a redelivery is a replay at the
// provider, then the receipt, deduplicated there by event id. The relay
// uses it for outbox events; a design without an outbox sends directly.
package delivery

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/provider"
)

// Courier carries effects to the provider through its client.
type Courier struct {
	client   *provider.Client
	captures lab.CaptureRecorder
}

// New returns a delivery through client that records each capture the
// provider answers in captures: the webhooks about it are matched with it.
func New(client *provider.Client, captures lab.CaptureRecorder) *Courier {
	return &Courier{client: client, captures: captures}
}

// Deliver captures the event's charge and sends its receipt; it reports
// whether the provider had the receipt already. Any failure leaves the
// event to be delivered again, which the provider deduplicates: by the
// capture's key when it is derived from the charge, and by the event id.
func (p *Courier) Deliver(ctx context.Context, e lab.Event) (bool, error) {
	d := e.Effects()
	key := lab.DerivedCaptureKey(e.ChargeID)
	if d.CaptureKey == lab.CaptureKeyRandom {
		key = "rnd_" + uuid.NewString() // a new key per attempt: the provider cannot tell a retry
	}
	fault := ""
	if e.Attempts <= 1 { // the first delivery suffers the run's provider fault; redeliveries do not
		fault = d.ProviderFault
	}
	_, dup, err := p.send(ctx, e, key, "outbox", fault)
	return dup, err
}

// SendDirect captures and sends the receipt at once, outside any
// transaction, with a key of its own: what a design without an outbox does.
func (p *Courier) SendDirect(ctx context.Context, e lab.Event) error {
	_, _, err := p.send(ctx, e, "direct_"+uuid.NewString(), "direct", e.Effects().ProviderFault)
	return err
}

// CaptureInline captures the event's charge at once under the key derived
// from it, and records the capture; the receipt is left to the outbox. A
// second call for the charge is a replay at the provider.
func (p *Courier) CaptureInline(ctx context.Context, e lab.Event, providerFault string) (string, error) {
	return p.capture(ctx, e, lab.DerivedCaptureKey(e.ChargeID), provider.ViaDirect, providerFault)
}

// send captures (see capture), then sends the receipt.
func (p *Courier) send(ctx context.Context, e lab.Event, key, via, fault string) (string, bool, error) {
	id, err := p.capture(ctx, e, key, via, fault)
	if err != nil {
		return "", false, err
	}
	dup, err := p.client.Receipt(ctx, provider.ReceiptRequest{EventID: e.ID, ChargeID: e.ChargeID, Namespace: string(e.Namespace), Tenant: e.Tenant, Run: e.Run, Via: via}, "")
	if err != nil {
		return "", false, fmt.Errorf("error sending the receipt of charge %s: %w", e.ChargeID, err)
	}
	return id, dup, nil
}

// capture captures under key and records the capture the provider
// answered; a failure leaves the capture to be made again, which the
// provider replays when the key is the same.
func (p *Courier) capture(ctx context.Context, e lab.Event, key, via, fault string) (string, error) {
	d := e.Effects()
	c, _, err := p.client.Capture(ctx, key, provider.CaptureRequest{
		ChargeID: e.ChargeID, Namespace: string(e.Namespace), Tenant: e.Tenant, Run: e.Run, AmountCents: d.AmountCents, Currency: d.Currency, Via: via,
	}, fault)
	if err != nil {
		return "", fmt.Errorf("error capturing charge %s at the provider: %w", e.ChargeID, err)
	}
	if err := p.captures.RecordCapture(ctx, e.Namespace, e.ChargeID, e.Tenant, c.ID); err != nil {
		return "", fmt.Errorf("error recording the capture of charge %s: %w", e.ChargeID, err)
	}
	return c.ID, nil
}
