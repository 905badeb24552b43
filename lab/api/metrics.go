package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotency-lab/lab/lab"
)

// metrics are the charge path's Prometheus series.
type metrics struct {
	claims, replays, reused, inProgress, charges, failures *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry, outbox interface {
	OutboxStats(ctx context.Context, ns lab.Namespace) (lab.OutboxStats, error)
}) *metrics {
	counter := func(name, help string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lab", Name: name, Help: help}, []string{"store"})
		reg.MustRegister(c)
		return c
	}
	m := &metrics{
		claims:     counter("idempotency_claims_total", "Attempts that claimed a key and ran the charge."),
		replays:    counter("idempotency_replays_total", "Attempts answered with a stored response."),
		reused:     counter("idempotency_key_reused_total", "Attempts rejected because their key was used with another request."),
		inProgress: counter("idempotency_in_progress_total", "Attempts rejected with 409 while their twin was in flight."),
		charges:    counter("charges_applied_total", "Charges this replica applied (201 answers that were not replays)."),
		failures:   counter("charge_failures_total", "Attempts that failed without a stored outcome (crashes included)."),
	}
	stats := func() lab.OutboxStats {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s, _ := outbox.OutboxStats(ctx, "") // every namespace
		return s
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "lab", Name: "outbox_pending", Help: "Outbox events not yet delivered."},
			func() float64 { return float64(stats().Pending) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "lab", Name: "outbox_oldest_pending_seconds", Help: "Age of the oldest undelivered outbox event."},
			func() float64 { return stats().OldestPendingAge.Seconds() }),
	)
	return m
}

func (m *metrics) observe(name lab.StoreName, out lab.Outcome, err error) {
	store := string(name)
	switch {
	case errors.Is(err, lab.ErrKeyReused):
		m.reused.WithLabelValues(store).Inc()
	case errors.Is(err, lab.ErrInProgress):
		m.inProgress.WithLabelValues(store).Inc()
	case err != nil:
		m.failures.WithLabelValues(store).Inc()
	case out.Replayed:
		m.replays.WithLabelValues(store).Inc()
	default:
		m.claims.WithLabelValues(store).Inc()
		if out.Response.Status == http.StatusCreated {
			m.charges.WithLabelValues(store).Inc()
		}
	}
}
