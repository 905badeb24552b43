// Package grade checks any Idempotency-Key API from outside, over real
// HTTP: a table of cases, each taken from the IETF draft "The
// Idempotency-Key HTTP Header Field" (draft-ietf-httpapi-idempotency-key-
// header-07) or from the lab's lesson, each answered pass, fail, not
// applicable or could not verify, with a sentence saying why. Every request
// it sends becomes an operation of one history, checked at the end with the
// lab's model of "charged at most once per key" (package history).
//
// It only ever sends to the target's scheme and host, on fresh random keys,
// within a budget of requests and of time.
package grade

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab/history"
)

// Verdict is a case's answer.
type Verdict string

// Verdicts of a case.
const (
	Pass          Verdict = "pass"
	Fail          Verdict = "fail"
	NotApplicable Verdict = "not applicable"
	Unverified    Verdict = "could not verify"
)

// Severity is how strongly a case's source asks for what it checks.
type Severity string

// Severities: the draft's words, or the lab's lesson.
const (
	Must   Severity = "MUST"
	Should Severity = "SHOULD"
	Lesson Severity = "lesson"
)

// Draft is the document the draft cases cite.
const Draft = "draft-ietf-httpapi-idempotency-key-header-07"

// KeyForm is how the Idempotency-Key value is written.
type KeyForm string

// Key forms: the draft's Structured Field String, or the bare value many
// clients send.
const (
	SFString KeyForm = "sf"
	Bare     KeyForm = "bare"
)

// Limits of a check: it must stay a check, not a load test.
const (
	MaxStorm        = 64
	MaxRetention    = 10 * time.Minute
	DefaultStorm    = 16
	DefaultRequests = 400
)

// Config says where the target is and how to talk to it.
type Config struct {
	// Target is the endpoint, query included: every request goes to its
	// scheme and host.
	Target string
	Method string // POST by default
	// Token and Token2 are bearer tokens of two clients (tenants); Token2
	// is needed only by the case that holds keys per client.
	Token, Token2 string
	// Body is the request body; {{key}} is replaced by the key and
	// {{run}} by the check's run id. OtherBody is "another payload" under
	// the same key; empty derives it by adding 1 to Body's first integer.
	Body, OtherBody string
	// IDPointer is the JSON pointer (RFC 6901) of the resource id in a 2xx
	// body; OperationID where an operation's answer (after a 202) holds it.
	IDPointer, OperationID string
	// ReplayHeader marks a replayed answer ("" for none).
	ReplayHeader string
	// Retention is how long the target declares it keeps a key; 0 skips
	// the case that waits it out.
	Retention time.Duration
	// Header is sent with every request; SlowHeader only with the first
	// request of the in-flight case, to make the target slow (a fault or
	// test header the target honours).
	Header, SlowHeader http.Header
	// ReadBack is a URL template ({key}: the key, unquoted and escaped)
	// answering the resources created under a key as JSON; ReadBackIDs the
	// pointer of their array in it ("" for the whole answer). Its elements
	// are ids or objects holding one at IDPointer.
	ReadBack, ReadBackIDs string
	KeyForm               KeyForm
	Storm                 int // concurrent retries of the storm, 1..MaxStorm
	Timeout               time.Duration
	RequestTimeout        time.Duration
	MaxRequests           int
	// Only, when set, runs just these cases (by id), plus the history.
	Only []string
	// Progress, when set, is told each case's result as it is decided.
	Progress func(done, total int, r Result)
}

// Defaults fills what c leaves empty.
func (c Config) withDefaults() Config {
	if c.Method == "" {
		c.Method = http.MethodPost
	}
	if c.Body == "" {
		c.Body = `{"account":"acct-check","amount_cents":1234,"currency":"USD"}`
	}
	if c.IDPointer == "" {
		c.IDPointer = "/id"
	}
	if c.OperationID == "" {
		c.OperationID = "/response/id"
	}
	if c.KeyForm == "" {
		c.KeyForm = SFString
	}
	if c.Storm == 0 {
		c.Storm = DefaultStorm
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Minute
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 10 * time.Second
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = DefaultRequests
	}
	return c
}

func (c Config) validate() (*url.URL, error) {
	target, err := url.Parse(c.Target)
	switch {
	case err != nil:
		return nil, fmt.Errorf("error parsing the target: %w", err)
	case target.Scheme != "http" && target.Scheme != "https" || target.Host == "":
		return nil, fmt.Errorf("the target must be an http:// or https:// URL with a host (got %q)", c.Target)
	case c.Storm < 1 || c.Storm > MaxStorm:
		return nil, fmt.Errorf("the storm sends 1..%d concurrent retries (got %d)", MaxStorm, c.Storm)
	case c.Retention < 0 || c.Retention > MaxRetention:
		return nil, fmt.Errorf("the retention case waits at most %s (got %s)", MaxRetention, c.Retention)
	case c.KeyForm != SFString && c.KeyForm != Bare:
		return nil, fmt.Errorf("the key form is %s or %s (got %q)", SFString, Bare, c.KeyForm)
	case c.MaxRequests < c.Storm+20:
		return nil, fmt.Errorf("a check needs at least %d requests with a storm of %d (got %d)", c.Storm+20, c.Storm, c.MaxRequests)
	}
	for _, p := range []string{c.IDPointer, c.OperationID, c.ReadBackIDs} {
		if p != "" && !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("a JSON pointer starts with / (got %q)", p)
		}
	}
	if c.ReadBack != "" {
		if !strings.Contains(c.ReadBack, "{key}") {
			return nil, fmt.Errorf("the read-back URL must name the key as {key} (got %q)", c.ReadBack)
		}
		rb, err := url.Parse(strings.ReplaceAll(c.ReadBack, "{key}", "k"))
		if err != nil {
			return nil, fmt.Errorf("error parsing the read-back URL: %w", err)
		}
		if rb.Scheme != target.Scheme || rb.Host != target.Host {
			return nil, fmt.Errorf("the read-back URL must be on the target's host %s://%s (got %s://%s): the check sends nowhere else",
				target.Scheme, target.Host, rb.Scheme, rb.Host)
		}
	}
	for _, id := range c.Only {
		if _, ok := caseByID(id); !ok {
			return nil, fmt.Errorf("no case %q (the cases: %s)", id, strings.Join(caseIDs(), ", "))
		}
	}
	return target, nil
}

// Result is one case's answer.
type Result struct {
	ID       string   `json:"id"`
	Title    string   `json:"title"`
	Source   string   `json:"source"`
	Severity Severity `json:"severity"`
	// Blocking cases make the check fail: the draft's MUSTs and the storm.
	Blocking bool    `json:"blocking"`
	Verdict  Verdict `json:"verdict"`
	Why      string  `json:"why"`
	Requests int     `json:"requests"`
	TookMS   float64 `json:"took_ms"`
}

// Report is a whole check.
type Report struct {
	Target   string   `json:"target"`
	Run      string   `json:"run"`
	Results  []Result `json:"cases"`
	Requests int      `json:"requests"`
	TookMS   float64  `json:"took_ms"`
	// Failed lists the blocking cases that failed: the check fails when
	// there is any.
	Failed  []string        `json:"failed"`
	History history.History `json:"-"`
}

// Passed reports whether no blocking case failed.
func (r Report) Passed() bool { return len(r.Failed) == 0 }

// ErrPreflight is a target that refused the check's first request: the
// check cannot say anything of it.
var ErrPreflight = errors.New("the target refused the first request")

// Run checks the target, case by case, within c's budget of time and
// requests, and checks the history of every request it sent.
func Run(ctx context.Context, c Config) (Report, error) {
	c = c.withDefaults()
	target, err := c.validate()
	if err != nil {
		return Report{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	run := make([]byte, 4)
	if _, err := rand.Read(run); err != nil {
		return Report{}, fmt.Errorf("error drawing the run id: %w", err)
	}
	ck := newChecker(c, target, hex.EncodeToString(run))
	defer ck.close()
	start := time.Now()
	if err := ck.preflight(ctx); err != nil {
		return Report{}, err
	}
	rep := Report{Target: c.Target, Run: ck.run, Failed: []string{}}
	cases := selected(c.Only)
	for i, cs := range cases {
		before, began := ck.sent(), time.Now()
		v, why := Unverified, "the check ran out of time before this case"
		if ctx.Err() == nil {
			v, why = cs.run(ctx, ck)
		}
		if v == Unverified && ck.overBudget() {
			why = fmt.Sprintf("the check's budget of %d requests ran out (%s)", c.MaxRequests, why)
		}
		r := Result{ID: cs.ID, Title: cs.Title, Source: cs.Source, Severity: cs.Severity, Blocking: cs.blocking(),
			Verdict: v, Why: why, Requests: ck.sent() - before, TookMS: ms(time.Since(began))}
		rep.Results = append(rep.Results, r)
		if r.Blocking && v == Fail {
			rep.Failed = append(rep.Failed, r.ID)
		}
		if c.Progress != nil {
			c.Progress(i+1, len(cases), r)
		}
	}
	rep.Requests, rep.TookMS, rep.History = ck.sent(), ms(time.Since(start)), ck.history()
	return rep, nil
}

// checker is one check's state: the client, its budget and every
// operation it recorded.
type checker struct {
	cfg    Config
	target *url.URL
	run    string
	client *http.Client
	origin time.Time

	mu       sync.Mutex
	requests int
	lanes    int
	ops      []history.Op
	errors   []exchange // the idempotency errors answered, for the problem+json case
	first    *exchange  // the preflight's answer: the sf-string case's first request
	replay   *replayPair
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
