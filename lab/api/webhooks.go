package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/signature"
)

// webhookTolerance is how far a webhook's signed timestamp may be from now:
// a captured request replayed later is refused.
const webhookTolerance = 5 * time.Minute

// providerEvent is a webhook's body. Unknown fields are ignored: a provider
// adds fields over time, and its consumers must not break on them.
type providerEvent struct {
	EventID string `json:"event_id"`
	Type    string `json:"type"`
	Data    struct {
		ChargeID    string `json:"charge_id"`
		Tenant      string `json:"tenant"`
		CaptureID   string `json:"capture_id"`
		CaptureKey  string `json:"idempotency_key"`
		AmountCents int64  `json:"amount_cents"`
		Currency    string `json:"currency"`
	} `json:"data"`
}

var (
	errSignature = problem(http.StatusUnauthorized, "webhook_signature_invalid", "Webhook signature invalid",
		"the Provider-Signature header is missing, malformed, too old or does not match the body; nothing was changed")
	errUnknownCharge = problem(http.StatusNotFound, "charge_not_found", "Charge not found",
		"the webhook names a charge this ledger does not hold; nothing was recorded, so a later retry is processed")
	errCaptureNotRecorded = problem(http.StatusConflict, "capture_not_recorded", "Capture not recorded",
		"the webhook would move a charge of which the lab has recorded no capture, and its capture was not made under the lab's own key; "+
			"nothing was recorded: a retry moves it only once the lab's own capture call recorded this very capture")
)

// providerWebhook is POST /webhooks/provider: a verified event that
// matches its charge (amount, currency, and a capture the lab recorded or
// made under its own key) moves it through the payment state machine, once per event id, in one
// transaction; one that does not is recorded as a mismatch and moves
// nothing. The charge is paid only through this route.
func (s *Server) providerWebhook(c echo.Context) error {
	if s.deps.Cost != nil {
		s.deps.Cost.Received("POST /webhooks/provider")
	}
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return problem(http.StatusBadRequest, "invalid_body", "Invalid body", "the body could not be read")
	}
	if err := signature.Verify(s.cfg.WebhookSecret, c.Request().Header.Get(signature.Header), body, s.cfg.Clock(), webhookTolerance); err != nil {
		s.metrics.webhook("bad_signature")
		s.log.WarnContext(c.Request().Context(), "webhook refused", "err", err)
		return errSignature
	}
	var ev providerEvent
	if err := json.Unmarshal(body, &ev); err != nil || ev.EventID == "" || ev.Type == "" || ev.Data.ChargeID == "" || ev.Data.Tenant == "" {
		return problem(http.StatusBadRequest, "invalid_webhook", "Invalid webhook",
			"the body must be a JSON event with event_id, type, data.charge_id and data.tenant")
	}
	res, err := s.deps.Books.ApplyWebhook(c.Request().Context(), lab.Webhook{
		EventID: ev.EventID, Type: ev.Type, ChargeID: ev.Data.ChargeID, Tenant: ev.Data.Tenant, ReceivedAt: s.cfg.Clock().UTC(),
		CaptureID: ev.Data.CaptureID, CaptureKey: ev.Data.CaptureKey, AmountCents: ev.Data.AmountCents, Currency: ev.Data.Currency,
	})
	switch {
	case errors.Is(err, lab.ErrUnknownCharge):
		s.metrics.webhook("unknown_charge")
		return errUnknownCharge
	case errors.Is(err, lab.ErrCaptureNotRecorded):
		s.metrics.webhook("unknown_capture")
		return errCaptureNotRecorded
	case errors.Is(err, lab.ErrUnknownWebhookType):
		return problem(http.StatusBadRequest, "invalid_webhook", "Invalid webhook", err.Error())
	case err != nil:
		return err
	}
	s.metrics.webhook(res.Outcome())
	if res.Mismatch != "" {
		s.log.WarnContext(c.Request().Context(), "webhook does not match its charge: recorded, nothing moved",
			"event_id", ev.EventID, "charge_id", ev.Data.ChargeID, "capture_id", ev.Data.CaptureID, "mismatch", res.Mismatch)
	}
	return c.JSON(http.StatusOK, webhookAnswer{EventID: ev.EventID, Outcome: res.Outcome(), WebhookResult: res})
}
