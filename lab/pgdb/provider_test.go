package pgdb_test

import (
	"context"
	"fmt"
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

// providerPools opens n pools on one migrated schema of the test's own:
// n replicas sharing the provider's records.
func providerPools(t *testing.T, n int) (pools []*pgxpool.Pool, schema string) {
	t.Helper()
	url, schema := labtest.Postgres(t)
	for i := range n {
		pool, err := pgdb.Open(context.Background(), pgdb.PoolConfig{URL: url, Schema: schema, Size: 8, AppName: "provider-records-test", Migrate: i == 0})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pools = append(pools, pool)
	}
	return pools, schema
}

func providerCapture(tenant, key string, at time.Time) provider.Capture {
	req := provider.CaptureRequest{ChargeID: "ch_" + key, Namespace: string(lab.NamespaceOf(tenant)), Tenant: tenant, AmountCents: 100, Currency: "USD", Via: provider.ViaOutbox}
	return provider.Capture{ID: "cap_" + uuid.NewString(), Key: key, ChargeID: req.ChargeID, Namespace: string(lab.NamespaceOf(tenant)), Tenant: tenant, AmountCents: 100,
		Currency: "USD", Via: provider.ViaOutbox, Status: provider.StatusSucceeded, Fingerprint: req.Fingerprint(), CreatedAt: at}
}

// TestProviderMigrateTwice: provider.sql runs on every start, so it must
// change nothing the second time, and keep what the tables hold.
func TestProviderMigrateTwice(t *testing.T) {
	pools, schema := providerPools(t, 1)
	ctx := context.Background()
	r := pgdb.NewProviderRecords(pools[0])
	if _, err := r.Capture(ctx, providerCapture("acme~2", "k1", time.Now()), nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := pgdb.Migrate(ctx, pools[0], schema); err != nil {
		t.Fatalf("migrating again: %v", err)
	}
	var ns string
	if err := pools[0].QueryRow(ctx, `SELECT namespace FROM provider_captures WHERE idempotency_key = 'k1'`).Scan(&ns); err != nil || ns != "acme" {
		t.Fatalf("namespace %q, %v; want acme, derived from the tenant", ns, err)
	}
}

// TestProviderCaptureAcrossReplicas: replicas share no memory, so only the
// table's primary key can make exactly one of 32 concurrent captures with
// one key apply; the others replay it. Receipts likewise by event id.
func TestProviderCaptureAcrossReplicas(t *testing.T) {
	pools, _ := providerPools(t, 2)
	replicas := []*pgdb.ProviderRecords{pgdb.NewProviderRecords(pools[0]), pgdb.NewProviderRecords(pools[1])}
	ctx := context.Background()
	const n = 32
	var (
		wg                sync.WaitGroup
		start             = make(chan struct{})
		mu                sync.Mutex
		applied, firstDup int
	)
	at := time.Now()
	for i := range n {
		wg.Go(func() {
			<-start
			r := replicas[i%2]
			cp, err := r.Capture(ctx, providerCapture("acme", "race", at), nil, nil)
			replayed := cp.Replayed
			if err != nil {
				t.Errorf("Capture: %v", err)
				return
			}
			dup, err := r.Receipt(ctx, provider.Receipt{EventID: "evt-race", ChargeID: "ch_race", Namespace: "acme", Tenant: "acme", Via: provider.ViaOutbox, ReceivedAt: at})
			if err != nil {
				t.Errorf("Receipt: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if !replayed {
				applied++
			}
			if !dup {
				firstDup++
			}
		})
	}
	close(start)
	wg.Wait()
	if applied != 1 || firstDup != 1 {
		t.Fatalf("%d captures applied, %d receipts first; want 1 and 1", applied, firstDup)
	}
	s, err := replicas[0].Stats(ctx, provider.Filter{Namespace: "acme"})
	want := provider.Stats{CapturesApplied: 1, CaptureRequests: n, CapturedCents: 100, Receipts: 1, ReceiptDeliveries: n}
	if err != nil || s != want {
		t.Fatalf("Stats = %+v, %v; want %+v", s, err, want)
	}
}

// TestProviderResetKeepsOthers: resetting a namespace removes its rows and
// no other namespace's, whose prefix it may share.
func TestProviderResetKeepsOthers(t *testing.T) {
	pools, _ := providerPools(t, 1)
	r := pgdb.NewProviderRecords(pools[0])
	ctx := context.Background()
	for _, tenant := range []string{"acme", "acme~2", "acme-2", "acmeco"} {
		if _, err := r.Capture(ctx, providerCapture(tenant, "k", time.Now()), nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Reset(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	list, err := r.Captures(ctx, provider.Filter{})
	if err != nil || len(list) != 2 {
		t.Fatalf("after Reset(acme): %+v, %v; want acme-2's and acmeco's", list, err)
	}
	for _, c := range list {
		if c.Tenant != "acme-2" && c.Tenant != "acmeco" {
			t.Fatalf("Reset(acme) kept %s", c.Tenant)
		}
	}
}

// TestProviderWebhooksClaimedOnce: workers of two replicas claim the same
// table's webhooks concurrently; SKIP LOCKED gives each webhook to exactly
// one of them, and a capture's second webhook to nobody while its first is
// pending.
func TestProviderWebhooksClaimedOnce(t *testing.T) {
	pools, _ := providerPools(t, 2)
	replicas := []*pgdb.ProviderRecords{pgdb.NewProviderRecords(pools[0]), pgdb.NewProviderRecords(pools[1])}
	ctx := context.Background()
	at := time.Now()
	const captures = 40
	for i := range captures {
		c := providerCapture("acme", fmt.Sprintf("k%d", i), at)
		var hooks []provider.Webhook
		for seq := range 2 {
			hooks = append(hooks, provider.Webhook{Seq: seq, EventID: fmt.Sprintf("evt_%d_%d", i, seq), Type: provider.EventCaptureProcessing,
				Body: []byte(`{}`), NextAttempt: at, GiveUpAt: at.Add(time.Hour), CreatedAt: at})
		}
		if _, err := replicas[i%2].Capture(ctx, c, hooks, nil); err != nil {
			t.Fatal(err)
		}
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		claimed = map[string]int{}
	)
	for i := range 8 {
		wg.Go(func() {
			for {
				got, err := replicas[i%2].ClaimWebhooks(ctx, at, 3, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, w := range got {
					claimed[w.EventID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(claimed) != captures {
		t.Fatalf("%d webhooks claimed, want the %d first ones (the second of each waits)", len(claimed), captures)
	}
	for id, n := range claimed {
		if n != 1 || id[len(id)-2:] != "_0" {
			t.Fatalf("webhook %s claimed %d times", id, n)
		}
	}
}

// TestProviderWebhooksHeldInOrder: a capture's later webhooks are written
// held and released by the statement that delivers or gives up the one
// before; a row written before held existed (not held) is held by the
// migration when its predecessor is pending.
func TestProviderWebhooksHeldInOrder(t *testing.T) {
	pools, schema := providerPools(t, 1)
	r := pgdb.NewProviderRecords(pools[0])
	ctx := context.Background()
	at := time.Now()
	write := func(key string) {
		t.Helper()
		var hooks []provider.Webhook
		for seq := range 3 {
			hooks = append(hooks, provider.Webhook{Seq: seq, EventID: fmt.Sprintf("evt_%s_%d", key, seq), Type: provider.EventCaptureProcessing,
				Body: []byte(`{}`), NextAttempt: at, GiveUpAt: at.Add(time.Hour), CreatedAt: at})
		}
		if _, err := r.Capture(ctx, providerCapture("acme", key, at), hooks, nil); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(want ...string) []provider.Webhook {
		t.Helper()
		got, err := r.ClaimWebhooks(ctx, at, 10, time.Minute)
		var ids []string
		for _, w := range got {
			ids = append(ids, w.EventID)
		}
		if err != nil || fmt.Sprint(ids) != fmt.Sprint(want) {
			t.Fatalf("claimed %v (%v), want %v", ids, err, want)
		}
		return got
	}
	write("k1")
	first := claim("evt_k1_0")
	claim() // the second waits for the first
	if err := r.WebhookDelivered(ctx, first[0], at, 200); err != nil {
		t.Fatal(err)
	}
	second := claim("evt_k1_1")
	if err := r.WebhookFailed(ctx, second[0], at, false, 503, "answered 503"); err != nil {
		t.Fatal(err)
	}
	second = claim("evt_k1_1") // due again; the third still waits
	if err := r.WebhookFailed(ctx, second[0], at, true, 400, "an answer not worth retrying"); err != nil {
		t.Fatal(err)
	}
	claim("evt_k1_2") // given up, it let the third go
	// As a table from before held: every row released. The migration,
	// which runs at every start, holds those behind a pending one again.
	write("k2")
	if _, err := pools[0].Exec(ctx, `UPDATE provider_webhooks SET held = false WHERE capture_id = (SELECT capture_id FROM provider_captures WHERE idempotency_key = 'k2')`); err != nil {
		t.Fatal(err)
	}
	if err := pgdb.Migrate(ctx, pools[0], schema); err != nil {
		t.Fatal(err)
	}
	k2 := claim("evt_k2_0")
	claim() // held again: they wait for the first
	if err := r.WebhookDelivered(ctx, k2[0], at, 200); err != nil {
		t.Fatal(err)
	}
	claim("evt_k2_1")
	// k1's, all done, and k2's released second are left as they were.
	var held int
	if err := pools[0].QueryRow(ctx, `SELECT count(*) FROM provider_webhooks WHERE held`).Scan(&held); err != nil || held != 1 {
		t.Fatalf("%d webhooks held (%v), want k2's third alone", held, err)
	}
}
