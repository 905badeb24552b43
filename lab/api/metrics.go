package api

import (
	"context"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/relay"
)

// metrics are the series seed 002 says to watch: the charge path by store
// and outcome, keys in flight and swept, the outbox and its relay, webhooks.
type metrics struct {
	claims, replays, reused, inProgress, charges, failures *prometheus.CounterVec
	rollbacks, crashes, swept                              *prometheus.CounterVec
	webhooks                                               *prometheus.CounterVec
	duration                                               *prometheus.HistogramVec
}

// metricsSources are what the gauges read when scraped.
type metricsSources struct {
	outbox interface {
		OutboxStats(ctx context.Context, ns lab.Namespace) (lab.OutboxStats, error)
	}
	stores map[lab.StoreName]lab.Store
	relay  func() relay.Counts // nil on a replica that runs no relay
	stuck  interface {
		OldestStuck(ctx context.Context, after time.Duration) (time.Duration, error)
	}
	stuckAfter time.Duration
}

func newMetrics(reg *prometheus.Registry, src metricsSources) *metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lab", Name: name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	m := &metrics{
		claims:     counter("idempotency_claims_total", "Attempts that claimed a key and ran the charge.", "store"),
		replays:    counter("idempotency_replays_total", "Attempts answered with a stored response.", "store"),
		reused:     counter("idempotency_key_reused_total", "Attempts rejected because their key was used with another request.", "store"),
		inProgress: counter("idempotency_in_progress_total", "Attempts rejected with 409 while their twin was in flight.", "store"),
		charges:    counter("charges_applied_total", "Charges this replica applied (201 answers that were not replays).", "store"),
		failures:   counter("charge_failures_total", "Attempts that failed without a stored outcome (crashes and rollbacks included).", "store"),
		rollbacks:  counter("charge_rollbacks_total", "Charges whose transaction was rolled back (the outbox write failed): nothing kept.", "store"),
		crashes:    counter("charge_crashes_total", "Attempts that died without an answer (injected crashes).", "store"),
		swept:      counter("keys_swept_total", "Expired idempotency keys the sweeper removed.", "store"),
		webhooks: counter("webhooks_total",
			"Provider webhooks received, by outcome: applied, ignored (no transition), duplicate, bad_signature, unknown_charge, "+
				"mismatch (amount, currency or capture not the charge's: recorded, nothing moved), unknown_capture (no capture of the charge recorded yet: retried).", "outcome"),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "lab", Name: "charge_duration_seconds", Help: "Time to answer POST /charges, by store and outcome.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"store", "outcome"}),
	}
	reg.MustRegister(m.duration)
	// A gauge whose source cannot be read is NaN, never a reassuring 0.
	stats := func(read func(lab.OutboxStats) float64) func() float64 {
		return func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			s, err := src.outbox.OutboxStats(ctx, "") // every namespace
			if err != nil {
				return math.NaN()
			}
			return read(s)
		}
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "lab", Name: "outbox_pending", Help: "Outbox events not yet delivered (NaN when the outbox cannot be read)."},
			stats(func(s lab.OutboxStats) float64 { return float64(s.Pending) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "lab", Name: "outbox_oldest_pending_seconds", Help: "Age of the oldest undelivered outbox event (NaN when the outbox cannot be read)."},
			stats(func(s lab.OutboxStats) float64 { return s.OldestPendingAge.Seconds() })),
	)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "lab", Name: "oldest_stuck_charge_seconds",
		Help: "Time since its capture of the oldest charge still pending more than the stuck bound after it: a webhook that never came (NaN when the books cannot be read)."},
		func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			age, err := src.stuck.OldestStuck(ctx, src.stuckAfter)
			if err != nil {
				return math.NaN()
			}
			return age.Seconds()
		}))
	for name, st := range src.stores {
		ager, ok := st.(lab.InFlightAger)
		if !ok {
			continue
		}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "lab", Name: "oldest_inflight_key_age_seconds", ConstLabels: prometheus.Labels{"store": string(name)},
			Help: "Age of the oldest operation still in flight (a key claimed, not completed): a stuck or crashed worker shows here.",
		}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			age, err := ager.OldestInFlight(ctx)
			if err != nil {
				return math.NaN()
			}
			return age.Seconds()
		}))
	}
	for name, st := range src.stores {
		c, ok := st.(lab.Completer)
		if !ok {
			continue
		}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "lab", Name: "completer_lag_seconds", ConstLabels: prometheus.Labels{"store": string(name)},
			Help: "How long the oldest unfinished key has waited for the completer beyond its threshold: a completer not keeping up, or not running (NaN when the keys cannot be read).",
		}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			lag, err := c.CompleterLag(ctx)
			if err != nil {
				return math.NaN()
			}
			return lag.Seconds()
		}))
	}
	if src.relay != nil {
		for _, o := range []struct {
			outcome string
			read    func(relay.Counts) int64
		}{
			{"delivered", func(c relay.Counts) int64 { return c.Delivered }},
			{"failed", func(c relay.Counts) int64 { return c.Failed }},
			{"dead", func(c relay.Counts) int64 { return c.Dead }},
			{"fenced", func(c relay.Counts) int64 { return c.Fenced }},
		} {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: "lab", Name: "relay_deliveries_total", ConstLabels: prometheus.Labels{"outcome": o.outcome},
				Help: "Outbox deliveries the relay attempted, by outcome: delivered, failed (retried later), dead, fenced (completion refused).",
			}, func() float64 { return float64(o.read(src.relay())) }))
		}
	}
	return m
}

// observe records one attempt's outcome and how long it took.
func (m *metrics) observe(name lab.StoreName, out lab.Outcome, err error, took time.Duration) {
	store := string(name)
	outcome := "charged"
	switch {
	case errors.Is(err, lab.ErrKeyReused):
		m.reused.WithLabelValues(store).Inc()
		outcome = "key_reused"
	case errors.Is(err, lab.ErrInProgress):
		m.inProgress.WithLabelValues(store).Inc()
		outcome = "in_progress"
	case errors.Is(err, lab.ErrCrash):
		m.failures.WithLabelValues(store).Inc()
		m.crashes.WithLabelValues(store).Inc()
		outcome = "crash"
	case errors.Is(err, lab.ErrOutboxWrite):
		m.failures.WithLabelValues(store).Inc()
		m.rollbacks.WithLabelValues(store).Inc()
		outcome = "rollback"
	case err != nil:
		m.failures.WithLabelValues(store).Inc()
		outcome = "failed"
	case out.Replayed:
		m.replays.WithLabelValues(store).Inc()
		outcome = "replay"
	default:
		m.claims.WithLabelValues(store).Inc()
		if out.Response.Status == http.StatusCreated {
			m.charges.WithLabelValues(store).Inc()
		} else {
			outcome = "refused" // a stored business outcome, such as an order already charged
		}
	}
	m.duration.WithLabelValues(store, outcome).Observe(took.Seconds())
}

func (m *metrics) webhook(outcome string) { m.webhooks.WithLabelValues(outcome).Inc() }
