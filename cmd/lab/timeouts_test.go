package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"
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
	var conn net.Conn
	for deadline := time.Now().Add(10 * time.Second); ; {
		if conn, err = net.Dial("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the front never listened: %v (%s)", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // the front is another goroutine's; it says nothing when it listens
	}
	defer conn.Close()
	start := time.Now()
	go func() { // a slow client: a byte of its headers every 50 ms
		for _, b := range []byte("GET /front/status HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n") {
			if _, err := conn.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	answer, err := io.ReadAll(conn) // until the front closes the connection
	if took := time.Since(start); err != nil || took > 3*time.Second || bytes.Contains(answer, []byte(" 200 ")) {
		t.Fatalf("a slow client was still served after %s (%q, %v): the read timeout of 300 ms did not cut it off", took, answer, err)
	}
}
