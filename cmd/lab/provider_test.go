package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// startProvider runs `lab provider` in this process with args until the
// test ends, and returns its base URL.
func startProvider(t *testing.T, args ...string) string {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- runProvider(ctx, append([]string{"-addr", addr, "-log-level", "error"}, args...), &logs)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("lab provider: %v\n%s", err, logs.String())
		}
	})
	base := "http://" + addr
	waitHealthy(t, base+"/provider")
	return base
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
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, head); err != nil {
			t.Fatal(err)
		}
		closed := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, conn) // returns when the server closes
			close(closed)
		}()
		select {
		case <-closed:
			return true
		case <-time.After(limit):
			return false
		}
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
