// Package redisdb holds the Redis the lab can start by itself: an embedded
// server (miniredis) for runs with no REDIS_URL.
package redisdb

import (
	"fmt"

	"github.com/alicebob/miniredis/v2"
)

// Embedded is an in-process Redis (miniredis) on a loopback port, used when
// no REDIS_URL is configured.
type Embedded struct {
	m *miniredis.Miniredis
}

// StartEmbedded starts miniredis with TTLs that run on the wall clock:
// without ClockTTL, miniredis only expires keys on FastForward, and every TTL
// lesson would silently not happen.
func StartEmbedded() (*Embedded, error) {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("error starting embedded redis: %w", err)
	}
	return &Embedded{m: m}, nil
}

// URL is the redis:// URL of the embedded server.
func (e *Embedded) URL() string { return "redis://" + e.m.Addr() + "/0" }

// Close stops it.
func (e *Embedded) Close() { e.m.Close() }
