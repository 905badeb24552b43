package lab_test

import (
	"errors"
	"testing"

	"github.com/idempotency-lab/lab/lab"
)

// TestNextPaymentState walks every transition of the state machine.
func TestNextPaymentState(t *testing.T) {
	states := []string{lab.PaymentPending, lab.PaymentSucceeded, lab.PaymentFailed}
	events := []string{lab.WebhookCaptureProcessing, lab.WebhookCaptureSucceeded, lab.WebhookCaptureFailed}
	want := map[[2]string]string{
		{lab.PaymentPending, lab.WebhookCaptureProcessing}:   lab.PaymentPending,
		{lab.PaymentPending, lab.WebhookCaptureSucceeded}:    lab.PaymentSucceeded,
		{lab.PaymentPending, lab.WebhookCaptureFailed}:       lab.PaymentFailed,
		{lab.PaymentSucceeded, lab.WebhookCaptureProcessing}: lab.PaymentSucceeded,
		{lab.PaymentSucceeded, lab.WebhookCaptureSucceeded}:  lab.PaymentSucceeded,
		{lab.PaymentSucceeded, lab.WebhookCaptureFailed}:     lab.PaymentSucceeded,
		{lab.PaymentFailed, lab.WebhookCaptureProcessing}:    lab.PaymentFailed,
		{lab.PaymentFailed, lab.WebhookCaptureSucceeded}:     lab.PaymentFailed, // failed never becomes succeeded
		{lab.PaymentFailed, lab.WebhookCaptureFailed}:        lab.PaymentFailed,
	}
	for _, s := range states {
		for _, e := range events {
			t.Run(s+"/"+e, func(t *testing.T) {
				got, err := lab.NextPaymentState(s, e)
				if err != nil {
					t.Fatal(err)
				}
				if w := want[[2]string{s, e}]; got != w {
					t.Fatalf("%s + %s = %s, want %s", s, e, got, w)
				}
			})
		}
	}
	if _, err := lab.NextPaymentState(lab.PaymentPending, "capture.refunded"); !errors.Is(err, lab.ErrUnknownWebhookType) {
		t.Fatalf("unknown type: %v", err)
	}
	if _, err := lab.NextPaymentState("paid", lab.WebhookCaptureSucceeded); err == nil {
		t.Fatal("an unknown state was accepted")
	}
}

// TestMatchWebhook: a webhook drives the state machine only when it is
// about the lab's own capture of the charge, for its amount and currency.
func TestMatchWebhook(t *testing.T) {
	terms := func(state string, captures ...string) lab.ChargeTerms {
		return lab.ChargeTerms{State: state, AmountCents: 1_000_000, Currency: "USD", Captures: captures}
	}
	hook := func(typ, capture string, cents int64, currency string) lab.Webhook {
		return lab.Webhook{EventID: "evt", Type: typ, ChargeID: "ch", CaptureID: capture, AmountCents: cents, Currency: currency}
	}
	own := func(w lab.Webhook) lab.Webhook {
		w.CaptureKey = lab.DerivedCaptureKey(w.ChargeID)
		return w
	}
	foreign := func(w lab.Webhook) lab.Webhook {
		w.CaptureKey = "rnd_1"
		return w
	}
	for _, c := range []struct {
		name     string
		w        lab.Webhook
		terms    lab.ChargeTerms
		mismatch bool
		err      error
		records  bool // the capture is recorded with the webhook
	}{
		{"TheLabsCapture", hook(lab.WebhookCaptureSucceeded, "cap_1", 1_000_000, "USD"), terms(lab.PaymentPending, "cap_1"), false, nil, false},
		{"OneCent", hook(lab.WebhookCaptureSucceeded, "cap_1", 1, "USD"), terms(lab.PaymentPending, "cap_1"), true, nil, false},
		{"AnotherCurrency", hook(lab.WebhookCaptureSucceeded, "cap_1", 1_000_000, "EUR"), terms(lab.PaymentPending, "cap_1"), true, nil, false},
		{"AnotherCapture", hook(lab.WebhookCaptureFailed, "cap_2", 1_000_000, "USD"), terms(lab.PaymentPending, "cap_1"), true, nil, false},
		{"AnotherCaptureOfAPaidCharge", hook(lab.WebhookCaptureFailed, "cap_2", 1_000_000, "USD"), terms(lab.PaymentSucceeded, "cap_1"), true, nil, false},
		{"NoneRecordedWouldMove", hook(lab.WebhookCaptureFailed, "cap_2", 1_000_000, "USD"), terms(lab.PaymentPending), false, lab.ErrCaptureNotRecorded, false},
		{"NoneRecordedMovesNothing", hook(lab.WebhookCaptureProcessing, "cap_2", 1_000_000, "USD"), terms(lab.PaymentPending), false, nil, false},
		{"NoneRecordedOneCent", hook(lab.WebhookCaptureSucceeded, "cap_2", 1, "USD"), terms(lab.PaymentPending), true, nil, false},
		{"OneOfTwo", hook(lab.WebhookCaptureSucceeded, "cap_1", 1_000_000, "USD"), terms(lab.PaymentPending, "cap_1", "cap_2"), false, nil, false},
		{"NoneRecordedTheLabsKey", own(hook(lab.WebhookCaptureSucceeded, "cap_1", 1_000_000, "USD")), terms(lab.PaymentPending), false, nil, true},
		{"NoneRecordedTheLabsKeyOneCent", own(hook(lab.WebhookCaptureSucceeded, "cap_1", 1, "USD")), terms(lab.PaymentPending), true, nil, true},
		{"NoneRecordedAnotherKey", foreign(hook(lab.WebhookCaptureSucceeded, "cap_1", 1_000_000, "USD")), terms(lab.PaymentPending), false, lab.ErrCaptureNotRecorded, false},
		{"AnotherCaptureUnderTheLabsKey", own(hook(lab.WebhookCaptureFailed, "cap_2", 1_000_000, "USD")), terms(lab.PaymentPending, "cap_1"), true, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			mismatch, err := lab.MatchWebhook(c.w, c.terms)
			if (mismatch != "") != c.mismatch || !errors.Is(err, c.err) || (c.err == nil && err != nil) {
				t.Fatalf("MatchWebhook = %q, %v; want mismatch %v, err %v", mismatch, err, c.mismatch, c.err)
			}
			if got := c.w.RecordsCapture(c.terms); got != c.records {
				t.Fatalf("RecordsCapture = %v, want %v", got, c.records)
			}
		})
	}
}
