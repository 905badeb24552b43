package main

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/labtest"
)

// TestFrontClosesASlowClient: the front, like every server of the project,
// takes its read timeout from the one config (here LAB_READ_TIMEOUT): a
// client that sends its headers a byte at a time is closed, not served
// forever.
func TestFrontClosesASlowClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv("LAB_READ_TIMEOUT", "300ms")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, []string{"proxy", "-addr", addr, "-targets", "http://127.0.0.1:1"}, &bytes.Buffer{}, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("proxy: %v (%s)", err, stderr.String())
		}
	})
	// The front is another goroutine's and says nothing when it listens.
	labtest.Eventually(t, "the front listening", func() bool {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	// A slow client: its headers a byte every 50 ms, never finished.
	if !<-labtest.SlowClient(t, addr, "GET /front/status HTTP/1.1\r\nHost: x\r\n", "X-Slow: 1\r\n", 3*time.Second) {
		t.Fatal("a slow client was still connected after 3s: the read timeout of 300 ms did not cut it off")
	}
}
