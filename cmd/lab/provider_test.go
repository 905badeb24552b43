package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// testProviderKey is the API key of the providers these tests start.
const testProviderKey = "cmd-test-provider-key"

// startProvider runs `lab provider -api-key testProviderKey` in this
// process with args until the test ends, and returns its base URL.
func startProvider(t *testing.T, args ...string) string {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", labtest.FreePorts(t, 1)[0])
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- runProvider(ctx, append([]string{"-addr", addr, "-log-level", "error", "-api-key", testProviderKey}, args...), &logs)
	}()
	stopped := false
	t.Cleanup(func() {
		cancel()
		if stopped {
			return
		}
		if err := <-done; err != nil {
			t.Errorf("lab provider: %v\n%s", err, logs.String())
		}
	})
	base := "http://" + addr
	// runProvider says nothing when it listens: the test asks /health.
	labtest.Eventually(t, "lab provider at "+base+" healthy", func() bool {
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("lab provider stopped: %v\n%s", err, logs.String())
		default:
		}
		r, err := labtest.Send(http.MethodGet, base+"/provider/health", nil, "")
		return err == nil && r.Status == http.StatusOK
	})
	return base
}

// TestProviderCommandAPIKey: `lab provider` refuses to start without an
// API key, and answers only the calls that carry it.
func TestProviderCommandAPIKey(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	if err := runProvider(t.Context(), []string{"-addr", "127.0.0.1:0", "-api-key", ""}, &logs); err == nil || !strings.Contains(err.Error(), "LAB_PROVIDER_API_KEY") {
		t.Fatalf("lab provider without a key: %v, want it refused, naming LAB_PROVIDER_API_KEY", err)
	}
	base := startProvider(t)
	for _, auth := range []string{"", "Bearer wrong", "Bearer " + testProviderKey} {
		h := http.Header{}
		if auth != "" {
			h.Set("Authorization", auth)
		}
		r := labtest.Do(t, http.MethodGet, base+"/provider/captures", h, "")
		want := http.StatusUnauthorized
		if auth == "Bearer "+testProviderKey {
			want = http.StatusOK
		}
		if r.Status != want {
			t.Errorf("GET /provider/captures with %q: %d %s, want %d", auth, r.Status, r.Body, want)
		}
	}
}

// TestProviderServerTimeouts: the standalone provider closes a client that
// trickles its headers and a kept-alive connection left idle, as the lab's
// own servers do.
func TestProviderServerTimeouts(t *testing.T) {
	t.Parallel()
	base := startProvider(t, "-read-timeout", "300ms", "-idle-timeout", "300ms")
	addr := base[len("http://"):]
	// closedWithin sends head and reports whether the server closed the
	// connection before limit.
	closedWithin := func(t *testing.T, head string, limit time.Duration) bool {
		t.Helper()
		return <-labtest.SlowClient(t, addr, head, "", limit)
	}
	t.Run("HeadersNeverEnd", func(t *testing.T) {
		if !closedWithin(t, "GET /provider/health HTTP/1.1\r\nHost: x\r\n", 5*time.Second) {
			t.Fatal("a request whose headers never end was not closed")
		}
	})
	t.Run("IdleKeepAlive", func(t *testing.T) {
		if !closedWithin(t, "GET /provider/health HTTP/1.1\r\nHost: x\r\n\r\n", 5*time.Second) {
			t.Fatal("an idle kept-alive connection was not closed")
		}
	})
}

// TestProviderCommandPruneRetention: `lab provider` prunes its records as
// the lab's own provider does, and refuses a retention its webhook window
// and lease could outlast, naming the flag and the least it may be.
func TestProviderCommandPruneRetention(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"-webhook-window", "10m", "-prune-after", "10m"}, []string{"-prune-after is 10m0s", "at least the webhook window (10m0s) and its lease (1m0s), 11m0s"}},
		{[]string{"-prune-interval", "0s"}, []string{"-prune-interval", "positive"}},
	} {
		var logs bytes.Buffer
		args := append([]string{"-addr", "127.0.0.1:0", "-api-key", testProviderKey}, c.args...)
		err := runProvider(t.Context(), args, &logs)
		for _, want := range c.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("lab provider %v: %v, want it refused, saying %q", c.args, err, want)
			}
		}
	}
	// On PostgreSQL, a receipt two hours old goes within a few passes,
	// rolled up into the counts that outlive it; a recent one stays.
	dbURL, schema := labtest.Postgres(t)
	startProvider(t, "-database-url", dbURL, "-pg-schema", schema, "-webhook-window", "1s", "-prune-after", "61s", "-prune-interval", "10ms")
	pool, err := pgdb.Open(t.Context(), pgdb.PoolConfig{URL: dbURL, Schema: schema, Size: 1, AppName: "provider-prune-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(t.Context(), `
		INSERT INTO provider_receipt_events (event_id, charge_id, tenant_id, via, first_received_at, last_received_at)
		VALUES ('evt_old', 'ch_old', 'acme', 'outbox', now() - interval '2 hours', now() - interval '2 hours'),
		       ('evt_new', 'ch_new', 'acme', 'outbox', now(), now())`); err != nil {
		t.Fatal(err)
	}
	labtest.Eventually(t, "the old receipt pruned and rolled up", func() bool {
		var left []string
		var rolled int64
		err := pool.QueryRow(t.Context(), `SELECT ARRAY(SELECT event_id FROM provider_receipt_events ORDER BY event_id),
			coalesce((SELECT sum(receipts) FROM provider_rollup), 0)`).Scan(&left, &rolled)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(left) == "[evt_new]" && rolled == 1
	})
}
