// Package delivery carries a charge's effects to the payment provider over
// HTTP in one request: the capture, keyed so that a redelivery is a replay
// at the provider, and with it the receipt, deduplicated there by event
// id. The relay uses it for outbox events; a design without an outbox
// sends directly.
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

// Deliver captures the event's charge with its receipt; it reports
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
	c, err := p.capture(ctx, e, key, provider.ViaOutbox, fault, true)
	return c.ReceiptDuplicate, err
}

// SendDirect captures with the receipt at once, outside any transaction,
// with a key of its own: what a design without an outbox does.
func (p *Courier) SendDirect(ctx context.Context, e lab.Event) error {
	_, err := p.capture(ctx, e, "direct_"+uuid.NewString(), provider.ViaDirect, e.Effects().ProviderFault, true)
	return err
}

// CaptureInline captures the event's charge at once under the key derived
// from it, and records the capture; the receipt is left to the outbox. A
// second call for the charge is a replay at the provider.
func (p *Courier) CaptureInline(ctx context.Context, e lab.Event, providerFault string) (string, error) {
	c, err := p.capture(ctx, e, lab.DerivedCaptureKey(e.ChargeID), provider.ViaDirect, providerFault, false)
	return c.ID, err
}

// capture captures under key, with the event's receipt when asked, and
// records the capture the provider answered; a failure leaves the capture
// to be made again, which the provider replays when the key is the same.
func (p *Courier) capture(ctx context.Context, e lab.Event, key, via, fault string, withReceipt bool) (provider.Captured, error) {
	d := e.Effects()
	req := provider.CaptureRequest{
		ChargeID: e.ChargeID, Namespace: string(e.Namespace), Tenant: e.Tenant, Run: e.Run, AmountCents: d.AmountCents, Currency: d.Currency, Via: via,
	}
	if withReceipt {
		req.EventID = e.ID
	}
	c, err := p.client.Capture(ctx, key, req, fault)
	if err != nil {
		return c, fmt.Errorf("error capturing charge %s at the provider: %w", e.ChargeID, err)
	}
	if err := p.captures.RecordCapture(ctx, e.Namespace, e.ChargeID, e.Tenant, c.ID); err != nil {
		return c, fmt.Errorf("error recording the capture of charge %s: %w", e.ChargeID, err)
	}
	return c, nil
}
