package effects_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

// outboxView is the part of GET /outbox this test reads.
type outboxView struct {
	Events     []lab.Event `json:"events"`
	Pending    int         `json:"outbox_pending"`
	Delivered  int         `json:"outbox_delivered"`
	Dead       int         `json:"outbox_dead"`
	InFlight   int         `json:"outbox_in_flight"`
	Retries    int         `json:"outbox_retries"`
	Receipts   int         `json:"receipts"`
	Deliveries int         `json:"deliveries"`
}

// TestDeadEventRetried: with the provider down (for this namespace: it
// drops every connection) an event backs off and ends dead after
// MaxAttempts; once it is up, POST /outbox/{id}/retry, by its namespace
// only, brings it back and it is delivered once.
func TestDeadEventRetried(t *testing.T) {
	for _, ledger := range []string{"memory", "postgres"} {
		t.Run(ledger, func(t *testing.T) {
			ticked := testsignal.New() // after each turn of the lab's relay
			cfg := e2e.Config(func(c *app.Config) {
				c.AdminToken = "admin-token-outbox"
				c.Relay.Signals.Ticked = ticked
				c.Relay.Interval, c.Relay.BaseBackoff, c.Relay.MaxBackoff, c.Relay.MaxAttempts = 5*time.Millisecond, time.Millisecond, 5*time.Millisecond, 3
			})
			if ledger == "postgres" {
				cfg.DatabaseURL, cfg.PGSchema = labtest.Postgres(t)
			}
			a := labtest.Start(t, cfg)
			base := a.URL()
			if err := a.Provider().SetFaults(t.Context(), "acme", provider.Faults{Down: true}); err != nil {
				t.Fatal(err)
			}
			dropped := func() int64 {
				t.Helper()
				got, err := a.Provider().Stats(t.Context(), provider.Filter{})
				if err != nil {
					t.Fatal(err)
				}
				return got.ConnectionsDropped
			}
			view := func() outboxView {
				t.Helper()
				r := labtest.Do(t, http.MethodGet, base+"/outbox", labtest.Bearer(labtest.Acme), "")
				if r.Status != http.StatusOK {
					t.Fatalf("GET /outbox: %d %s", r.Status, r.Body)
				}
				return labtest.Decode[outboxView](t, r)
			}
			waitFor := func(what string, ok func(outboxView) bool) outboxView {
				t.Helper()
				var v outboxView
				ticked.WaitUntil(t, what, func() bool { v = view(); return ok(v) })
				return v
			}
			retry := func(token, id string, status int, code string) labtest.Reply {
				t.Helper()
				r := labtest.Do(t, http.MethodPost, base+"/outbox/"+id+"/retry", labtest.Bearer(token), "")
				if r.Status != status {
					t.Fatalf("retry %s as %s: %d %s, want %d", id, token, r.Status, r.Body, status)
				}
				if code != "" {
					if pr := labtest.Decode[lab.Problem](t, r); pr.Code != code || r.Header.Get("Content-Type") != "application/problem+json" {
						t.Fatalf("retry %s as %s: problem %+v, want %s", id, token, pr, code)
					}
				}
				return r
			}

			if r := labtest.Charge(t, base, "memory", labtest.Acme, "k-dead-letter", e2e.Body2500); r.Status != http.StatusCreated {
				t.Fatalf("charge: %d %s", r.Status, r.Body)
			}
			// GET /outbox reads the events and the counts in two statements:
			// wait until both show the move, not just one of them.
			v := waitFor("the event dead", func(v outboxView) bool {
				return v.Dead == 1 && len(v.Events) == 1 && v.Events[0].State == lab.EventDead
			})
			ev := v.Events[0]
			if ev.State != lab.EventDead || ev.Attempts != 3 || ev.LastError == "" || v.Receipts != 0 || dropped() != 3 {
				t.Fatalf("dead event %+v, receipts %d, connections the provider dropped %d: want dead after 3 attempts", ev, v.Receipts, dropped())
			}
			if v.Retries != 2 || v.InFlight != 0 {
				t.Fatalf("outbox counts %d retries, %d in flight: want the 2 attempts after the first, none leased", v.Retries, v.InFlight)
			}

			retry(labtest.Globex, ev.ID, http.StatusNotFound, "event_not_found") // another namespace's
			retry(labtest.Acme, "00000000-0000-4000-8000-000000000000", http.StatusNotFound, "event_not_found")
			retry(labtest.Acme, "not-an-id", http.StatusNotFound, "event_not_found")
			if v := view(); v.Dead != 1 || v.Events[0].Attempts != 3 {
				t.Fatalf("a refused retry changed the event: %+v", v.Events[0])
			}

			if err := a.Provider().ClearFaults(t.Context(), "acme"); err != nil {
				t.Fatal(err)
			}
			r := retry(labtest.Acme, ev.ID, http.StatusOK, "")
			got := labtest.Decode[struct {
				Requeued lab.Event `json:"requeued"`
			}](t, r).Requeued
			if got.ID != ev.ID || got.State != lab.EventPending || got.Attempts != 0 {
				t.Fatalf("requeued %+v: want it pending with its attempts reset", got)
			}
			v = waitFor("the event delivered", func(v outboxView) bool {
				return v.Delivered == 1 && len(v.Events) == 1 && v.Events[0].State == lab.EventDelivered
			})
			if v.Events[0].Attempts != 1 || v.Dead != 0 || v.Pending != 0 || v.Retries != 0 || v.Receipts != 1 || v.Deliveries != 1 {
				t.Fatalf("outbox %+v, event %+v: want it delivered once, on its first attempt after the retry", v, v.Events[0])
			}
			retry(labtest.Acme, ev.ID, http.StatusConflict, "event_delivered")
			retry("admin-token-outbox", ev.ID, http.StatusConflict, "event_delivered") // the admin sees every namespace
			if v := view(); v.Deliveries != 1 {
				t.Fatalf("%d deliveries after a refused retry, want 1", v.Deliveries)
			}
		})
	}
}
