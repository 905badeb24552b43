// Package httpserve builds every HTTP server the project starts (the lab's
// replicas, its provider, the front, the bench's ceiling handler) from one
// set of timeouts, so none of them can be held open by a slow client.
package httpserve

import (
	"net/http"
	"time"
)

// Timeouts bound one connection of a server.
type Timeouts struct {
	// Read bounds reading a whole request, headers and body, so a client
	// that sends a byte a second is closed. Default 10s.
	Read time.Duration
	// Write bounds a whole exchange, from the end of the headers to the end
	// of the answer; on the lab it must outlast the longest run. Default 5m.
	Write time.Duration
	// Idle closes keep-alive connections left idle. Default 1m.
	Idle time.Duration
}

// DefaultTimeouts are the lab's.
func DefaultTimeouts() Timeouts {
	return Timeouts{Read: 10 * time.Second, Write: 5 * time.Minute, Idle: time.Minute}
}

// MaxHeaderBytes bounds a request's headers: the lab's need a few hundred
// bytes, far less than net/http's 1 MB default.
const MaxHeaderBytes = 16 << 10

// New is a server of h with the timeouts t. The headers must arrive within
// 5 s (or the read timeout, if shorter).
func New(h http.Handler, t Timeouts) *http.Server {
	return &http.Server{
		Handler: h, ReadHeaderTimeout: min(t.Read, 5*time.Second), ReadTimeout: t.Read,
		WriteTimeout: t.Write, IdleTimeout: t.Idle, MaxHeaderBytes: MaxHeaderBytes,
	}
}
