package provider_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/provider"
)

// backend opens fresh, empty records of one kind.
type backend struct {
	name string
	open func(t *testing.T) provider.Records
}

// backends are the record kinds every records test runs against: their
// answers must agree.
func backends() []backend {
	return []backend{
		{"memory", func(*testing.T) provider.Records { return provider.NewMemory() }},
		{"postgres", func(t *testing.T) provider.Records {
			pool, acks := openPools(t)
			return pgdb.NewProviderRecords(pool).AckingThrough(acks) // as the lab runs them
		}},
	}
}

// openPools connects to a migrated schema of the test's own, with a pool
// for the records and one committing asynchronously for the webhooks'
// claims and outcomes.
func openPools(t *testing.T) (pool, acks *pgxpool.Pool) {
	t.Helper()
	url, schema := labtest.Postgres(t)
	open := func(async bool) *pgxpool.Pool {
		p, err := pgdb.Open(context.Background(), pgdb.PoolConfig{URL: url, Schema: schema, Size: 8, AppName: "provider-test", Migrate: !async, AsyncCommit: async})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	pool = open(false) // migrates the schema first
	acks = open(true)
	// The records' pool keeps the server's setting (the throwaway server's
	// is already off); the acks' pool turns it off on any server.
	var commit string
	if err := acks.QueryRow(context.Background(), "SHOW synchronous_commit").Scan(&commit); err != nil || commit != "off" {
		t.Fatalf("a pool opened with AsyncCommit commits with synchronous_commit %q (%v), want off", commit, err)
	}
	return pool, acks
}

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// capture builds a capture as the provider would.
func capture(tenant, key, chargeID string, cents int64, at time.Time) provider.Capture {
	req := provider.CaptureRequest{ChargeID: chargeID, Namespace: string(lab.NamespaceOf(tenant)), Tenant: tenant, AmountCents: cents, Currency: "USD", Via: provider.ViaOutbox}
	return provider.Capture{
		ID: "cap_" + uuid.NewString(), Key: key, ChargeID: chargeID, Namespace: string(lab.NamespaceOf(tenant)), Tenant: tenant, AmountCents: cents,
		Currency: "USD", Via: provider.ViaOutbox, Status: provider.StatusSucceeded, Fingerprint: req.Fingerprint(), CreatedAt: at,
	}
}

func mustCapture(t *testing.T, r provider.Records, c provider.Capture) provider.Capture {
	t.Helper()
	stored, err := r.Capture(context.Background(), c, nil, nil)
	replayed := stored.Replayed
	if err != nil || replayed {
		t.Fatalf("Capture(%s): replayed %v, err %v; want a new capture", c.Key, replayed, err)
	}
	return stored.Capture
}

func ids(list []provider.Capture) []string {
	out := make([]string, len(list))
	for i, c := range list {
		out[i] = c.Key
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRecords(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			t.Run("CaptureOnce", func(t *testing.T) {
				r := b.open(t)
				c := capture("acme", "k1", "ch_1", 1250, t0.Add(1234*time.Nanosecond))
				stored := mustCapture(t, r, c)
				want := c
				want.Requests, want.CreatedAt = 1, t0.Add(time.Microsecond)
				if stored != want {
					t.Fatalf("stored %+v, want %+v", stored, want)
				}
				list, err := r.Captures(context.Background(), provider.Filter{})
				if err != nil || len(list) != 1 || list[0] != want {
					t.Fatalf("Captures = %+v, %v; want [%+v]", list, err, want)
				}
			})
			t.Run("Replay", func(t *testing.T) {
				r := b.open(t)
				first := mustCapture(t, r, capture("acme", "k1", "ch_1", 1250, t0))
				again := capture("acme", "k1", "ch_1", 1250, t0.Add(time.Second))
				again.Via, again.Run = provider.ViaDirect, "another-run" // not part of the fingerprint
				stored, err := r.Capture(context.Background(), again, nil, nil)
				replayed := stored.Replayed
				if err != nil || !replayed {
					t.Fatalf("replayed %v, err %v; want a replay", replayed, err)
				}
				if stored.ID != first.ID || stored.Requests != 2 || stored.Via != provider.ViaOutbox || !stored.CreatedAt.Equal(t0) {
					t.Fatalf("replayed %+v, want the first capture %+v with 2 requests", stored, first)
				}
			})
			t.Run("ErrKeyMismatch", func(t *testing.T) {
				r := b.open(t)
				mustCapture(t, r, capture("acme", "k1", "ch_1", 1250, t0))
				for _, other := range []provider.Capture{
					capture("acme", "k1", "ch_1", 999, t0),
					capture("acme", "k1", "ch_2", 1250, t0),
				} {
					if _, err := r.Capture(context.Background(), other, nil, nil); !errors.Is(err, provider.ErrKeyMismatch) {
						t.Fatalf("Capture with another fingerprint: %v, want ErrKeyMismatch", err)
					}
				}
				s, err := r.Stats(context.Background(), provider.Filter{})
				if err != nil || s.CapturesApplied != 1 || s.CaptureRequests != 1 {
					t.Fatalf("Stats = %+v, %v; want 1 capture of 1 request (refusals are not counted)", s, err)
				}
			})
			t.Run("KeysPerTenant", func(t *testing.T) {
				r := b.open(t)
				mustCapture(t, r, capture("acme", "k1", "ch_1", 100, t0))
				mustCapture(t, r, capture("acme~2", "k1", "ch_2", 100, t0))
			})
			t.Run("ConcurrentOnce", func(t *testing.T) {
				r := b.open(t)
				const n = 32
				var (
					wg       sync.WaitGroup
					start    = make(chan struct{})
					mu       sync.Mutex
					applied  int
					storedID = map[string]bool{}
				)
				for range n {
					wg.Go(func() {
						<-start
						stored, err := r.Capture(context.Background(), capture("acme", "race", "ch_1", 500, t0), nil, nil)
						replayed := stored.Replayed
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							t.Errorf("Capture: %v", err)
							return
						}
						if !replayed {
							applied++
						}
						storedID[stored.ID] = true
					})
				}
				close(start)
				wg.Wait()
				if applied != 1 || len(storedID) != 1 {
					t.Fatalf("%d of %d calls applied, %d capture ids answered; want 1 and 1", applied, n, len(storedID))
				}
				list, err := r.Captures(context.Background(), provider.Filter{})
				if err != nil || len(list) != 1 || list[0].Requests != n {
					t.Fatalf("Captures = %+v, %v; want one capture of %d requests", list, err, n)
				}
			})
			t.Run("ReceiptOnce", func(t *testing.T) {
				r := b.open(t)
				rc := provider.Receipt{EventID: uuid.NewString(), ChargeID: "ch_1", Namespace: "acme", Tenant: "acme", Run: "r1", Via: provider.ViaOutbox, ReceivedAt: t0}
				for i, want := range []bool{false, true, true} {
					if dup, err := r.Receipt(context.Background(), rc); err != nil || dup != want {
						t.Fatalf("delivery %d: duplicate %v, err %v; want %v", i+1, dup, err, want)
					}
				}
				s, err := r.Stats(context.Background(), provider.Filter{Run: "r1"})
				if err != nil || s.Receipts != 1 || s.ReceiptDeliveries != 3 {
					t.Fatalf("Stats = %+v, %v; want 1 receipt delivered 3 times", s, err)
				}
			})
			t.Run("ReceiptWithItsCapture", func(t *testing.T) {
				// The receipt a capture call carries is recorded with it: once
				// by event id whether the capture applied or replayed, and not
				// at all when the capture is refused.
				r := b.open(t)
				ctx := context.Background()
				rc := provider.Receipt{EventID: uuid.NewString(), ChargeID: "ch_1", Namespace: "acme", Tenant: "acme", Run: "r1", Via: provider.ViaOutbox, ReceivedAt: t0}
				c := capture("acme", "k1", "ch_1", 700, t0)
				c.Run = "r1"
				for i, want := range []provider.Captured{{Replayed: false, ReceiptDuplicate: false}, {Replayed: true, ReceiptDuplicate: true}} {
					got, err := r.Capture(ctx, c, nil, &rc)
					if err != nil || got.Replayed != want.Replayed || got.ReceiptDuplicate != want.ReceiptDuplicate {
						t.Fatalf("call %d: %+v, %v; want replayed %v, receipt duplicate %v", i+1, got, err, want.Replayed, want.ReceiptDuplicate)
					}
					c.ID = "cap_" + uuid.NewString()
				}
				other := rc
				other.EventID = uuid.NewString()
				if _, err := r.Capture(ctx, capture("acme", "k1", "ch_1", 999, t0), nil, &other); !errors.Is(err, provider.ErrKeyMismatch) {
					t.Fatalf("a reused key: %v, want ErrKeyMismatch", err)
				}
				s, err := r.Stats(ctx, provider.Filter{Run: "r1"})
				if err != nil || s.CapturesApplied != 1 || s.Receipts != 1 || s.ReceiptDeliveries != 2 {
					t.Fatalf("Stats = %+v, %v; want 1 capture, 1 receipt delivered twice (none for the refused call)", s, err)
				}
			})
			t.Run("CapturesFilter", func(t *testing.T) {
				r := b.open(t)
				seed(t, r)
				ctx := context.Background()
				for _, tt := range []struct {
					name string
					f    provider.Filter
					want []string
				}{
					{"All", provider.Filter{}, []string{"k6", "k5", "k4", "k3", "k2", "k1"}},
					{"Namespace", provider.Filter{Namespace: "acme"}, []string{"k5", "k4", "k2", "k1"}},
					{"SecondTenantIsTheNamespaces", provider.Filter{Namespace: "acme", Run: "r2"}, []string{"k4"}},
					{"Run", provider.Filter{Run: "r1"}, []string{"k6", "k5", "k3", "k2", "k1"}},
					{"Charge", provider.Filter{ChargeID: "ch_1"}, []string{"k2", "k1"}},
					{"Limit", provider.Filter{Limit: 2}, []string{"k6", "k5"}},
					{"LimitClamped", provider.Filter{Limit: -5}, []string{"k6"}},
					{"None", provider.Filter{Namespace: "nobody"}, nil},
				} {
					list, err := r.Captures(ctx, tt.f)
					if err != nil || !equal(ids(list), tt.want) {
						t.Errorf("%s: Captures(%+v) = %v, %v; want %v", tt.name, tt.f, ids(list), err, tt.want)
					}
				}
			})
			t.Run("Stats", func(t *testing.T) {
				r := b.open(t)
				seed(t, r)
				ctx := context.Background()
				for _, tt := range []struct {
					name string
					f    provider.Filter
					want provider.Stats
				}{
					{"All", provider.Filter{}, provider.Stats{CapturesApplied: 6, CaptureRequests: 7, ChargesCapturedTwice: 1,
						CapturedCents: 100 + 100 + 300 + 400 + 600, Receipts: 2, ReceiptDeliveries: 3, DirectCaptures: 1}},
					{"Namespace", provider.Filter{Namespace: "acme"}, provider.Stats{CapturesApplied: 4, CaptureRequests: 5,
						ChargesCapturedTwice: 1, CapturedCents: 100 + 100 + 400, Receipts: 1, ReceiptDeliveries: 2, DirectCaptures: 1}},
					{"Run", provider.Filter{Run: "r2"}, provider.Stats{CapturesApplied: 1, CaptureRequests: 1, CapturedCents: 400}},
					{"Charge", provider.Filter{ChargeID: "ch_3"}, provider.Stats{CapturesApplied: 1, CaptureRequests: 1, CapturedCents: 300,
						Receipts: 1, ReceiptDeliveries: 1}},
				} {
					s, err := r.Stats(ctx, tt.f)
					if err != nil || s != tt.want {
						t.Errorf("%s: Stats(%+v) = %+v, %v; want %+v", tt.name, tt.f, s, err, tt.want)
					}
				}
			})
			t.Run("Webhooks", func(t *testing.T) {
				r := b.open(t)
				ctx := context.Background()
				c := capture("acme", "k1", "ch_1", 100, t0)
				c.Run = "r-webhooks"
				stored, err := r.Capture(ctx, c, hooksOf(c, 2), nil)
				if err != nil {
					t.Fatal(err)
				}
				// A replay writes no webhooks.
				again := capture("acme", "k1", "ch_1", 100, t0)
				if cp, err := r.Capture(ctx, again, hooksOf(again, 2), nil); err != nil || !cp.Replayed {
					t.Fatalf("replay: %v, %v", cp.Replayed, err)
				}
				if s, err := r.Stats(ctx, provider.Filter{}); err != nil || s.WebhooksQueued != 2 {
					t.Fatalf("Stats = %+v, %v; want the capture's 2 webhooks, none of the replay's", s, err)
				}
				if n, err := r.Queued(ctx); err != nil || n != 2 {
					t.Fatalf("Queued = %d, %v; want the capture's 2 webhooks", n, err)
				}
				claim := func(at time.Duration, want ...int) []provider.Webhook {
					t.Helper()
					got, err := r.ClaimWebhooks(ctx, t0.Add(at), 10, time.Minute)
					if err != nil {
						t.Fatal(err)
					}
					var seqs []int
					for _, w := range got {
						if w.CaptureID != stored.ID || w.ClaimToken == "" || w.State != provider.WebhookPending || len(w.Body) == 0 {
							t.Fatalf("claimed %+v", w)
						}
						seqs = append(seqs, w.Seq)
					}
					if !slices.Equal(seqs, want) {
						t.Fatalf("claimed at +%s: seqs %v, want %v", at, seqs, want)
					}
					return got
				}
				// The second waits for the first, which a claim hides for its lease.
				first := claim(0, 0)
				claim(0)
				// After the lease, another claim takes it over; the first is fenced.
				second := claim(2*time.Minute, 0)
				if second[0].Attempts != 2 || second[0].ClaimToken == first[0].ClaimToken {
					t.Fatalf("taken over: %+v after %+v", second[0], first[0])
				}
				if err := r.WebhookDelivered(ctx, first[0], t0, 200); !errors.Is(err, provider.ErrWebhookFenced) {
					t.Fatalf("the superseded claim completed: %v", err)
				}
				// Failed, it is due at its next attempt.
				if err := r.WebhookFailed(ctx, second[0], t0.Add(3*time.Minute), false, 503, "answered 503"); err != nil {
					t.Fatal(err)
				}
				claim(2*time.Minute + time.Second)
				third := claim(3*time.Minute, 0)
				if err := r.WebhookDelivered(ctx, third[0], t0.Add(3*time.Minute), 200); err != nil {
					t.Fatal(err)
				}
				if err := r.WebhookDelivered(ctx, third[0], t0.Add(3*time.Minute), 200); !errors.Is(err, provider.ErrWebhookFenced) {
					t.Fatalf("delivered twice: %v", err)
				}
				// Then the second; given up, it is dead.
				last := claim(3*time.Minute, 1)
				if err := r.WebhookFailed(ctx, last[0], t0.Add(4*time.Minute), true, 400, "answered 400"); err != nil {
					t.Fatal(err)
				}
				claim(time.Hour)
				other := capture("globex", "k2", "ch_2", 100, t0)
				other.Run = "r-webhooks"
				if _, err := r.Capture(ctx, other, hooksOf(other, 1), nil); err != nil {
					t.Fatal(err)
				}
				if n, err := r.Queued(ctx); err != nil || n != 1 {
					t.Fatalf("Queued = %d, %v; want globex's webhook", n, err)
				}
				// Refused as a capture the receiver cannot place (409), it is
				// still queued, but no longer counted as what a drain waits for.
				refused, err := r.ClaimWebhooks(ctx, t0.Add(time.Hour), 10, time.Minute)
				if err != nil || len(refused) != 1 || refused[0].ChargeID != "ch_2" {
					t.Fatalf("claimed %+v, %v; want globex's webhook", refused, err)
				}
				if err := r.WebhookFailed(ctx, refused[0], t0.Add(time.Hour+time.Second), false, 409, "answered 409"); err != nil {
					t.Fatal(err)
				}
				if n, err := r.Queued(ctx); err != nil || n != 0 {
					t.Fatalf("Queued = %d, %v; want none: the one left was refused with 409", n, err)
				}
				for f, want := range map[provider.Filter][3]int{
					{}:                                     {1, 1, 1},
					{Namespace: "acme"}:                    {0, 1, 1},
					{ChargeID: "ch_2"}:                     {1, 0, 0},
					{Namespace: "nobody"}:                  {0, 0, 0},
					{Run: "r-webhooks"}:                    {1, 1, 1},
					{Run: "another-run"}:                   {0, 0, 0},
					{Namespace: "globex"}:                  {1, 0, 0},
					{ChargeID: "ch_1"}:                     {0, 1, 1},
					{Namespace: "acme~2"}:                  {0, 0, 0},
					{Namespace: "acme", Run: "r-webhooks"}: {0, 1, 1},
				} {
					s, err := r.Stats(ctx, f)
					if got := [3]int{s.WebhooksQueued, s.WebhooksDelivered, s.WebhooksDead}; err != nil || got != want {
						t.Errorf("Stats(%+v) webhooks queued, delivered, dead = %v, %v; want %v", f, got, err, want)
					}
				}
				// Reset forgets a namespace's webhooks with its captures.
				if err := r.Reset(ctx, "globex"); err != nil {
					t.Fatal(err)
				}
				if s, err := r.Stats(ctx, provider.Filter{}); err != nil || s.WebhooksQueued != 0 || s.WebhooksDelivered != 1 {
					t.Fatalf("after Reset(globex): %+v, %v", s, err)
				}
				if n, err := r.Queued(ctx); err != nil || n != 0 {
					t.Fatalf("Queued after Reset(globex) = %d, %v; want none: the rest were sent", n, err)
				}
			})
			t.Run("Reset", func(t *testing.T) {
				r := b.open(t)
				seed(t, r)
				ctx := context.Background()
				if err := r.Reset(ctx, "acme"); err != nil {
					t.Fatal(err)
				}
				for ns, want := range map[string]provider.Stats{
					"acme":   {},
					"globex": {CapturesApplied: 2, CaptureRequests: 2, CapturedCents: 900, Receipts: 1, ReceiptDeliveries: 1},
				} {
					if s, err := r.Stats(ctx, provider.Filter{Namespace: ns}); err != nil || s != want {
						t.Fatalf("after Reset(acme), Stats(%s) = %+v, %v; want %+v", ns, s, err, want)
					}
				}
				if err := r.Reset(ctx, ""); err != nil {
					t.Fatal(err)
				}
				if s, err := r.Stats(ctx, provider.Filter{}); err != nil || s != (provider.Stats{}) {
					t.Fatalf("after Reset(\"\"), Stats = %+v, %v; want nothing", s, err)
				}
				// The keys are free again.
				mustCapture(t, r, capture("acme", "k1", "ch_9", 1, t0))
			})
		})
	}
}

// hooksOf builds n webhooks of c, due at t0 with a 10-minute window.
func hooksOf(c provider.Capture, n int) []provider.Webhook {
	var out []provider.Webhook
	for i := range n {
		out = append(out, provider.Webhook{CaptureID: c.ID, Seq: i, EventID: fmt.Sprintf("evt_%s_%d", c.Key, i), Type: provider.EventCaptureProcessing,
			ChargeID: c.ChargeID, Namespace: c.Namespace, Tenant: c.Tenant, Run: c.Run, Body: []byte(`{"event_id":"x"}`), State: provider.WebhookPending,
			NextAttempt: t0, GiveUpAt: t0.Add(10 * time.Minute), CreatedAt: t0})
	}
	return out
}

// seed records, oldest first: k1 and k2 capture ch_1 twice (two keys),
// k3 belongs to globex, k4 to acme's second tenant in run r2, k5 is a
// direct capture replayed once, k6 a declined one of globex, and k5 and k6
// share a time (the later insert lists first).
func seed(t *testing.T, r provider.Records) {
	t.Helper()
	ctx := context.Background()
	add := func(c provider.Capture, run, via, status string) provider.Capture {
		c.Run, c.Via, c.Status = run, via, status
		return mustCapture(t, r, c)
	}
	add(capture("acme", "k1", "ch_1", 100, t0), "r1", provider.ViaOutbox, provider.StatusSucceeded)
	add(capture("acme", "k2", "ch_1", 100, t0.Add(time.Second)), "r1", provider.ViaOutbox, provider.StatusSucceeded)
	add(capture("globex", "k3", "ch_3", 300, t0.Add(2*time.Second)), "r1", provider.ViaOutbox, provider.StatusSucceeded)
	add(capture("acme~2", "k4", "ch_4", 400, t0.Add(3*time.Second)), "r2", provider.ViaOutbox, provider.StatusSucceeded)
	k5 := add(capture("acme", "k5", "ch_5", 500, t0.Add(4*time.Second)), "r1", provider.ViaDirect, provider.StatusFailed)
	add(capture("globex", "k6", "ch_6", 600, t0.Add(4*time.Second)), "r1", provider.ViaOutbox, provider.StatusSucceeded)
	again := capture("acme", "k5", "ch_5", 500, t0.Add(5*time.Second))
	if stored, err := r.Capture(ctx, again, nil, nil); err != nil || !stored.Replayed || stored.ID != k5.ID {
		t.Fatalf("replaying k5: %+v, %v, %v", stored, stored.Replayed, err)
	}
	for _, rc := range []provider.Receipt{
		{EventID: "evt-a", ChargeID: "ch_1", Namespace: "acme", Tenant: "acme", Run: "r1", Via: provider.ViaOutbox, ReceivedAt: t0},
		{EventID: "evt-a", ChargeID: "ch_1", Namespace: "acme", Tenant: "acme", Run: "r1", Via: provider.ViaOutbox, ReceivedAt: t0.Add(time.Second)},
		{EventID: "evt-b", ChargeID: "ch_3", Namespace: "globex", Tenant: "globex", Run: "r1", Via: provider.ViaOutbox, ReceivedAt: t0},
	} {
		if _, err := r.Receipt(ctx, rc); err != nil {
			t.Fatal(err)
		}
	}
}
