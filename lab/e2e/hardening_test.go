package e2e_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
)

// TestTimeoutsCloseSlowClients: a client that trickles its headers or its
// body, or sits idle on a kept-alive connection, is closed by the server's
// timeouts while normal requests keep working.
func TestTimeoutsCloseSlowClients(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config(func(c *app.Config) {
		c.ReadTimeout, c.IdleTimeout = 400*time.Millisecond, 400*time.Millisecond
	}))
	addr := strings.TrimPrefix(a.URL(), "http://")
	closedWithin := func(t *testing.T, head, drip string, limit time.Duration) bool {
		t.Helper()
		return <-labtest.SlowClient(t, addr, head, drip, limit)
	}
	t.Run("Slowloris", func(t *testing.T) {
		if !closedWithin(t, "POST /charges HTTP/1.1\r\nHost: lab\r\nX-Slow: ", "a", 5*time.Second) {
			t.Fatal("a client trickling its headers was never closed")
		}
	})
	t.Run("SlowBody", func(t *testing.T) {
		head := "POST /charges?store=memory HTTP/1.1\r\nHost: lab\r\nAuthorization: Bearer " + labtest.Acme +
			"\r\nIdempotency-Key: k-slow-body\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{"
		if !closedWithin(t, head, " ", 5*time.Second) {
			t.Fatal("a client trickling its body was never closed")
		}
		if n := e2e.KeyCharges(t, a, "acme", memory.Name, "k-slow-body"); n != 0 {
			t.Fatalf("the slow body was charged %d times", n)
		}
	})
	t.Run("Idle", func(t *testing.T) {
		if !closedWithin(t, "GET /health HTTP/1.1\r\nHost: lab\r\n\r\n", "", 5*time.Second) {
			t.Fatal("an idle kept-alive connection was never closed")
		}
	})
	t.Run("NormalRequestsStillWork", func(t *testing.T) {
		if r := labtest.Charge(t, a.URL(), memory.Name, labtest.Acme, "k-normal", e2e.Body2500); r.Status != http.StatusCreated {
			t.Fatalf("charge: %d %s", r.Status, r.Body)
		}
	})
}

// TestBodiesMustSayTheirLength: chunked bodies, a request with both
// Content-Length and Transfer-Encoding among them, an unsupported coding,
// a malformed head and oversized bodies are refused with a problem before
// anything reads them, and nothing is charged.
func TestBodiesMustSayTheirLength(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.Config())
	addr := strings.TrimPrefix(a.URL(), "http://")
	send := func(t *testing.T, raw string) int {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, raw); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode >= 400 && ct != "application/problem+json" {
			t.Errorf("content type %q", ct)
		}
		return resp.StatusCode
	}
	head := "POST /charges?store=memory HTTP/1.1\r\nHost: lab\r\nAuthorization: Bearer " + labtest.Acme + "\r\nIdempotency-Key: k-te\r\n"
	chunk := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(e2e.Body2500), e2e.Body2500)
	for _, tc := range []struct {
		name, raw string
		want      int
	}{
		{"Chunked", head + "Transfer-Encoding: chunked\r\n\r\n" + chunk, http.StatusLengthRequired},
		{"ContentLengthAndTransferEncoding", head + "Content-Length: 57\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk, http.StatusLengthRequired},
		{"TooLarge", head + "Content-Length: 70000\r\n\r\n", http.StatusRequestEntityTooLarge},
		// net/http refuses a coding other than chunked alone before any
		// handler runs: still a problem, and a 400.
		{"IdentityThenChunked", head + "Transfer-Encoding: identity, chunked\r\n\r\n" + chunk, http.StatusBadRequest},
		{"MalformedHeader", head + "No colon here\r\n\r\n", http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := send(t, tc.raw); got != tc.want {
				t.Fatalf("status %d, want %d", got, tc.want)
			}
		})
	}
	if n := e2e.KeyCharges(t, a, "acme", memory.Name, "k-te"); n != 0 {
		t.Fatalf("refused bodies were charged %d times", n)
	}
}
