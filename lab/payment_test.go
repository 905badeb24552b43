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
