// Package experiment runs the lab: N attempts of one charge released
// together by a barrier against real servers, then the ledger's verdict.
package experiment

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab"
)

// ReplicaHeader names, on every answer of the lab, the replica that gave it.
const ReplicaHeader = "Lab-Replica"

// ReplayedFromHeader names where a replay was read, for designs with more
// than one place (a cache in front of the database).
const ReplayedFromHeader = "Lab-Replayed-From"

// Request is one attempt to send.
type Request struct {
	URL    string
	Header http.Header
	Body   []byte
}

// Try is one HTTP exchange of an attempt.
type Try struct {
	Status   int     `json:"status"`            // 0 when the connection dropped
	Replica  string  `json:"replica,omitempty"` // the replica that answered (its Lab-Replica header)
	Replayed bool    `json:"replayed"`
	From     string  `json:"replayed_from,omitempty"` // where the replay was read, when the design says
	Code     string  `json:"code,omitempty"`
	Error    string  `json:"error,omitempty"`
	StartMS  float64 `json:"start_ms"` // since the barrier's release
	// Phases are the server's steps (its Server-Timing), each at_ms since
	// the barrier's release: claim, work, charge, commit, or replay.
	Phases     []lab.PhaseAt `json:"phases,omitempty"`
	LatencyMS  float64       `json:"latency_ms"`
	Body       []byte        `json:"-"`
	retryAfter time.Duration // from Retry-After
}

// Result is what one attempt saw: its tries in order, the last one final.
type Result struct {
	Attempt int    `json:"attempt"`
	Target  string `json:"target"`
	Replica string `json:"replica,omitempty"` // the replica of the final answer
	Tries   []Try  `json:"tries"`
	start   time.Time
}

// Final is the attempt's last try.
func (r Result) Final() Try { return r.Tries[len(r.Tries)-1] }

// Retry is how a client retries an attempt that got no answer or a 409/5xx.
// The zero value sends once.
type Retry struct {
	Until time.Time     // no new try starts after this
	Base  time.Duration // first backoff; doubles, capped at 4×Base
}

// Fire sends every request at once: each goroutine is ready and blocked on
// one barrier before any is released. It returns the results in request
// order and the spread between the first and the last start.
func Fire(ctx context.Context, client *http.Client, reqs []Request, retry Retry) ([]Result, time.Duration) {
	results := make([]Result, len(reqs))
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	var released time.Time
	for i, req := range reqs {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-release
			results[i] = attempt(ctx, client, i, req, retry, released)
		}()
	}
	ready.Wait()
	released = time.Now()
	close(release)
	done.Wait()
	first, last := results[0].start, results[0].start
	for _, r := range results {
		if r.start.Before(first) {
			first = r.start
		}
		if r.start.After(last) {
			last = r.start
		}
	}
	return results, last.Sub(first)
}

func attempt(ctx context.Context, client *http.Client, i int, req Request, retry Retry, released time.Time) Result {
	r := Result{Attempt: i + 1, Target: req.URL, start: time.Now()}
	backoff := retry.Base
	for {
		t := send(ctx, client, req, released)
		r.Tries = append(r.Tries, t)
		if t.Replica != "" {
			r.Replica = t.Replica
		}
		retryable := t.Status == 0 || t.Status == http.StatusConflict && t.Code == "idempotency_in_progress" || t.Status >= 500 ||
			t.Status == http.StatusAccepted // still working under a lease: ask again
		if !retryable || retry.Until.IsZero() {
			return r
		}
		wait := max(backoff, t.retryAfter)
		wait = min(wait, 4*retry.Base, time.Until(retry.Until))
		if wait < 0 || ctx.Err() != nil {
			return r
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return r
		}
		backoff = min(2*backoff, 4*retry.Base)
	}
}

func send(ctx context.Context, client *http.Client, req Request, released time.Time) Try {
	start := time.Now()
	t := Try{StartMS: ms(start.Sub(released))}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, req.URL, bytes.NewReader(req.Body))
	if err != nil {
		t.Error = err.Error()
		return t
	}
	// Without GetBody the transport cannot replay the request by itself:
	// net/http silently retries requests that carry an Idempotency-Key when a
	// kept-alive connection drops, and the lab's retries must be its own.
	hr.GetBody = nil
	hr.Header = req.Header.Clone()
	hr.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(hr)
	if err == nil {
		t.Body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	t.LatencyMS = ms(time.Since(start))
	if err != nil {
		t.Error = connError(err)
		return t
	}
	t.Status = resp.StatusCode
	t.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	t.Replica = resp.Header.Get(ReplicaHeader)
	t.From = resp.Header.Get(ReplayedFromHeader)
	for _, p := range lab.ParseServerTiming(resp.Header.Get("Server-Timing")) {
		t.Phases = append(t.Phases, lab.PhaseAt{Name: p.Name, AtMS: t.StartMS + p.AtMS})
	}
	t.Code = problemCode(t.Body)
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		t.retryAfter = time.Duration(s) * time.Second / 4 // the lab retries faster than a real client
	}
	return t
}

func connError(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "connection closed without a response"
	}
	return err.Error()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
