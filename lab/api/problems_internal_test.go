package api

import (
	"context"
	"fmt"
	"testing"
)

// TestDeadlinesTellWhoseTheyAre: a deadline that ran out below the API
// while the request still waited is a dependency that did not answer in
// time (503 unavailable, to retry), not the request's own end.
func TestDeadlinesTellWhoseTheyAre(t *testing.T) {
	err := fmt.Errorf("error reading the provider's stats: %w", context.DeadlineExceeded)
	for ended, want := range map[bool]string{false: "unavailable", true: "request_cancelled"} {
		if p, retry := toProblem(err, ended); p.code != want || retry == 0 {
			t.Errorf("request ended %v: %s, Retry-After %s; want %s with Retry-After", ended, p.code, retry, want)
		}
	}
}
