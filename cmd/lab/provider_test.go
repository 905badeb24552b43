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
