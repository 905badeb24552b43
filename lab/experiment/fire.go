// Package experiment runs the lab: N attempts of one charge released
// together by a barrier against real servers, then the ledger's verdict.
package experiment

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/url"
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

// Try is one HTTP exchange of an attempt: a POST of the charge, or a poll
// of the operation a 202 pointed at.
type Try struct {
	Status   int     `json:"status"`            // 0 when the connection dropped; a poll's: the operation's final status, or 202 while it runs
	Replica  string  `json:"replica,omitempty"` // the replica that answered (its Lab-Replica header)
	Replayed bool    `json:"replayed"`
	From     string  `json:"replayed_from,omitempty"` // where the replay was read, when the design says
	Code     string  `json:"code,omitempty"`
	Error    string  `json:"error,omitempty"`
	StartMS  float64 `json:"start_ms"` // on the run's time axis: since its first release
	// Poll marks a GET of the operation's Location, after a 202.
	Poll bool `json:"poll,omitempty"`
	// RetryAfterMS is the answer's Retry-After, which the client honours.
	RetryAfterMS float64 `json:"retry_after_ms,omitempty"`
	// Phases are the server's steps (its Server-Timing), each at_ms on the
	// run's time axis: claim, work, renew, fenced, charge, commit, replay.
	Phases    []lab.PhaseAt `json:"phases,omitempty"`
	LatencyMS float64       `json:"latency_ms"`
	Body      []byte        `json:"-"`
	location  string        // a 202's Location, resolved
}

// Result is what one attempt saw: its tries in order, the last one final.
type Result struct {
	Attempt int    `json:"attempt"`
	Target  string `json:"target"`
	Replica string `json:"replica,omitempty"` // the replica of the final answer
	Tries   []Try  `json:"tries"`
	start   time.Time
	// released is the barrier's release this attempt's times were first
	// measured from; Rebase moves them onto the run's axis.
	released time.Time
}

// Final is the attempt's last try.
func (r Result) Final() Try { return r.Tries[len(r.Tries)-1] }

// Retry is how the client follows an attempt that got no final answer yet:
// a dropped connection or a 5xx (after a backoff), a 409 in progress (after
// its Retry-After, as sent), a 202 (by polling its Location, after its
// Retry-After). The zero value sends once.
type Retry struct {
	Budget time.Duration // no new try starts later than this after the attempt's first
	Base   time.Duration // backoff without a Retry-After; doubles, capped at 4×Base
}

// Fire sends every request at once: each goroutine is ready and blocked on
// one barrier before any is released. It returns the results in request
// order, their times measured from the release, and the spread between the
// first and the last start.
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
	// On the wall clock alone, in whole microseconds, as the servers mark
	// their phases (this machine's clock is theirs): Truncate drops the
	// monotonic reading, so every Sub with released reads the wall clock,
	// and phases of different attempts compare exactly.
	released = time.Now().Truncate(time.Microsecond)
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

// Rebase moves every time of results onto the axis that starts at origin,
// the run's first release: the retries of a two-phase run are then drawn
// after what came before them, not on a clock of their own.
func Rebase(results []Result, origin time.Time) {
	for i := range results {
		shift := ms(results[i].released.Sub(origin))
		results[i].released = origin
		for j := range results[i].Tries {
			t := &results[i].Tries[j]
			t.StartMS += shift
			for k := range t.Phases {
				t.Phases[k].AtMS += shift
			}
		}
	}
}

// retryable reports an answer a client cannot stop at: no answer, a 5xx,
// a 409 still in progress, or a 202 whose operation still runs.
func retryable(t Try) bool {
	return t.Status == 0 || t.Status >= 500 || t.Status == http.StatusAccepted ||
		t.Status == http.StatusConflict && t.Code == "idempotency_in_progress"
}

func attempt(ctx context.Context, client *http.Client, i int, req Request, retry Retry, released time.Time) Result {
	r := Result{Attempt: i + 1, Target: req.URL, start: time.Now(), released: released}
	until := r.start.Add(retry.Budget)
	backoff := retry.Base
	location := "" // the operation to poll, once a 202 named it
	for {
		var t Try
		if location != "" {
			t = poll(ctx, client, location, req.Header, released)
		} else {
			t = send(ctx, client, req, released)
		}
		r.Tries = append(r.Tries, t)
		if t.Replica != "" {
			r.Replica = t.Replica
		}
		switch {
		case t.location != "":
			location = t.location
		case t.Poll && t.Status == http.StatusNotFound:
			location = "" // the operation is gone (released, swept): send the charge again, which the key keeps safe
		}
		if !retryable(t) && !(t.Poll && t.Status == http.StatusNotFound) || retry.Budget == 0 {
			return r
		}
		wait := backoff
		if t.RetryAfterMS > 0 {
			wait = time.Duration(t.RetryAfterMS * float64(time.Millisecond)) // as the server asked
		} else {
			backoff = min(2*backoff, 4*retry.Base)
		}
		if time.Now().Add(wait).After(until) || ctx.Err() != nil {
			return r
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return r
		}
	}
}

func send(ctx context.Context, client *http.Client, req Request, released time.Time) Try {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, req.URL, bytes.NewReader(req.Body))
	if err != nil {
		return Try{StartMS: ms(time.Since(released)), Error: err.Error()}
	}
	// Without GetBody the transport cannot replay the request by itself:
	// net/http silently retries requests that carry an Idempotency-Key when a
	// kept-alive connection drops, and the lab's retries must be its own.
	hr.GetBody = nil
	hr.Header = req.Header.Clone()
	hr.Header.Set("Content-Type", "application/json")
	t, resp := exchange(client, hr, released)
	if resp == nil {
		return t
	}
	t.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	t.From = resp.Header.Get(ReplayedFromHeader)
	if t.Status == http.StatusAccepted {
		if loc, err := hr.URL.Parse(resp.Header.Get("Location")); err == nil && resp.Header.Get("Location") != "" {
			t.location = loc.String()
		}
	}
	return t
}

// poll reads the operation a 202 named: its final answer once completed
// (a stored answer, so a replay), 202 while it still runs.
func poll(ctx context.Context, client *http.Client, location string, header http.Header, released time.Time) Try {
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, location, nil)
	if err != nil {
		return Try{StartMS: ms(time.Since(released)), Poll: true, Error: err.Error()}
	}
	hr.Header.Set("Authorization", header.Get("Authorization")) // the operation is the tenant's
	t, _ := exchange(client, hr, released)
	t.Poll = true
	if t.Status != http.StatusOK {
		return t
	}
	var op lab.Operation
	if err := json.Unmarshal(t.Body, &op); err != nil {
		t.Status, t.Error = 0, "unreadable operation: "+err.Error()
		return t
	}
	if op.State != lab.KeyCompleted || op.Status == 0 {
		t.Status = http.StatusAccepted // still running: poll again
		t.location = location
		return t
	}
	t.Status, t.Body, t.Replayed = op.Status, op.Body, true
	t.Code = problemCode(op.Body)
	return t
}

// exchange sends hr and reads the whole answer; resp is nil when none came.
func exchange(client *http.Client, hr *http.Request, released time.Time) (Try, *http.Response) {
	start := time.Now()
	t := Try{StartMS: ms(start.Sub(released))}
	resp, err := client.Do(hr)
	if err == nil {
		t.Body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	t.LatencyMS = ms(time.Since(start))
	if err != nil {
		t.Error = connError(err)
		return t, nil
	}
	t.Status = resp.StatusCode
	t.Replica = resp.Header.Get(ReplicaHeader)
	// Each phase at its instant on the server, from the request's arrival
	// there: a request that reached its server late is drawn late.
	arrival, phases := lab.ParseServerTiming(resp.Header.Get("Server-Timing"))
	if arrival.IsZero() { // a server that does not say: from the try's start
		arrival = start
	}
	for _, p := range phases {
		p.AtMS = ms(arrival.Add(time.Duration(math.Round(p.AtMS*1000)) * time.Microsecond).Sub(released))
		t.Phases = append(t.Phases, p)
	}
	t.Code = problemCode(t.Body)
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
		t.RetryAfterMS = float64(s) * 1000
	}
	return t, resp
}

func connError(err error) string {
	var uerr *url.Error
	if errors.As(err, &uerr) && uerr.Timeout() {
		return "timed out without a response"
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "connection closed without a response"
	}
	return err.Error()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
