package grade

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab/history"
)

// maxBody bounds what the check reads of one answer.
const maxBody = 1 << 20

// errBudget is a request the check's budget no longer allows.
var errBudget = errors.New("the check's request budget is spent")

// request is one request a case sends, and where it goes in the history.
type request struct {
	url    string
	method string
	header http.Header
	body   []byte
	// The history's partition and lane; record false leaves the request
	// out (it names no one key).
	record bool
	key    history.Key
	fp     string
	lane   int
}

// exchange is one request and its answer; status 0 when none came.
type exchange struct {
	req      request
	status   int
	header   http.Header
	body     []byte
	err      error
	id       string // the resource id of a 2xx body (or of a resolved operation)
	replayed bool
	location string // a 202's Location, resolved against the request
	call     time.Time
	ret      time.Time
}

func (e exchange) ok() bool {
	return e.status >= 200 && e.status < 300 && e.status != http.StatusAccepted
}

// told says what an answer was, in a few words.
func (e exchange) told() string {
	switch {
	case e.err != nil && e.status == 0:
		return "no answer (" + e.err.Error() + ")"
	case e.id != "":
		return fmt.Sprintf("%d with id %s", e.status, e.id)
	case problemCode(e.body) != "":
		return fmt.Sprintf("%d %s", e.status, problemCode(e.body))
	}
	return strconv.Itoa(e.status)
}

func newChecker(c Config, target *url.URL, run string) *checker {
	ck := &checker{cfg: c, target: target, run: run, origin: time.Now()}
	ck.client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8}, Timeout: c.RequestTimeout, CheckRedirect: ck.sameHost}
	return ck
}

func (ck *checker) close() { ck.client.CloseIdleConnections() }

// sameHost follows a redirect only on the target's host.
func (ck *checker) sameHost(req *http.Request, via []*http.Request) error {
	if len(via) >= 3 {
		return errors.New("more than 3 redirects")
	}
	return ck.allowed(req.URL)
}

// allowed refuses any URL off the target's scheme and host: the check sends
// nowhere else, whatever an answer's Location or a redirect names.
func (ck *checker) allowed(u *url.URL) error {
	if u.Scheme != ck.target.Scheme || u.Host != ck.target.Host {
		return fmt.Errorf("refused to send to %s://%s: the check sends only to the target's host %s", u.Scheme, u.Host, ck.target.Host)
	}
	return nil
}

func (ck *checker) sent() int {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	return ck.requests
}

func (ck *checker) overBudget() bool { return ck.sent() >= ck.cfg.MaxRequests }

// take counts one request against the budget.
func (ck *checker) take() error {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	if ck.requests >= ck.cfg.MaxRequests {
		return errBudget
	}
	ck.requests++
	return nil
}

// lane is a new client of the history: one sequence of requests.
func (ck *checker) lane() int {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	ck.lanes++
	return ck.lanes
}

// key names a fresh key of this run for a case.
func (ck *checker) key(name string) string { return "check-" + ck.run + "-" + name }

// endpoint is the history's name for the target's method and path.
func (ck *checker) endpoint() string { return ck.cfg.Method + " " + ck.target.Path }

// tenant is the history's name for a token: never the token itself.
func tenantOf(token2 bool) string {
	if token2 {
		return "token2"
	}
	return "token1"
}

// keyValue writes key in form.
func keyValue(key string, form KeyForm) string {
	if form == Bare {
		return key
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(key) + `"`
}

// body renders the body template for key.
func (ck *checker) body(tmpl, key string) []byte {
	return []byte(strings.NewReplacer("{{key}}", key, "{{run}}", ck.run).Replace(tmpl))
}

// charge is the request of a case: key (in form, "" for none) and body,
// as token or token2, on a new lane unless one is given.
func (ck *checker) charge(key string, form KeyForm, body []byte, token2 bool, lane int) request {
	h := http.Header{}
	for k, vs := range ck.cfg.Header {
		h[k] = append([]string(nil), vs...)
	}
	h.Set("Content-Type", "application/json")
	if tok := ck.token(token2); tok != "" {
		h.Set("Authorization", "Bearer "+tok)
	}
	if key != "" {
		h.Set("Idempotency-Key", keyValue(key, form))
	}
	if lane == 0 {
		lane = ck.lane()
	}
	return request{url: ck.cfg.Target, method: ck.cfg.Method, header: h, body: body, record: key != "",
		key: history.Key{Tenant: tenantOf(token2), Endpoint: ck.endpoint(), Key: key}, fp: fingerprint(body), lane: lane}
}

func (ck *checker) token(token2 bool) string {
	if token2 {
		return ck.cfg.Token2
	}
	return ck.cfg.Token
}

// send sends r once with the check's client.
func (ck *checker) send(ctx context.Context, r request) exchange {
	return ck.do(ctx, ck.client, r)
}

// do sends r once with client, reads the answer and records the operation.
func (ck *checker) do(ctx context.Context, client *http.Client, r request) exchange {
	e := exchange{req: r, call: time.Now()}
	defer func() { ck.record(e) }()
	u, err := url.Parse(r.url)
	if err == nil {
		err = ck.allowed(u)
	}
	if err == nil {
		err = ck.take()
	}
	if err != nil {
		e.err, e.ret = err, time.Now()
		return e
	}
	hr, err := http.NewRequestWithContext(ctx, r.method, r.url, bytes.NewReader(r.body))
	if err != nil {
		e.err, e.ret = err, time.Now()
		return e
	}
	// Without GetBody net/http cannot resend the request on its own (it
	// would, for a request carrying an Idempotency-Key, when a kept-alive
	// connection drops): every retry here is one the check means.
	hr.GetBody = nil
	if r.body == nil {
		hr.Body, hr.ContentLength = nil, 0
	}
	hr.Header = r.header.Clone()
	resp, err := client.Do(hr)
	if err == nil {
		e.body, err = io.ReadAll(io.LimitReader(resp.Body, maxBody))
		resp.Body.Close()
		e.status, e.header = resp.StatusCode, resp.Header
		if e.status == http.StatusAccepted && resp.Header.Get("Location") != "" {
			if loc, lerr := resp.Request.URL.Parse(resp.Header.Get("Location")); lerr == nil {
				e.location = loc.String()
			}
		}
	}
	e.ret, e.err = time.Now(), err
	if e.ok() {
		e.id = idAt(e.body, ck.cfg.IDPointer)
	}
	e.replayed = ck.marked(e.header)
	return e
}

// marked reports an answer the replay header marks as a replay.
func (ck *checker) marked(h http.Header) bool {
	if ck.cfg.ReplayHeader == "" || h == nil {
		return false
	}
	v := strings.ToLower(strings.TrimSpace(h.Get(ck.cfg.ReplayHeader)))
	return v != "" && v != "false" && v != "0" && v != "?0"
}

// record keeps e as an operation of the history, and an idempotency
// error's answer for the problem+json case.
func (ck *checker) record(e exchange) {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	switch e.status {
	case http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity:
		ck.errors = append(ck.errors, e)
	}
	if !e.req.record || errors.Is(e.err, errBudget) {
		return
	}
	ck.ops = append(ck.ops, ck.op(e))
}

func (ck *checker) us(t time.Time) int64 { return t.Sub(ck.origin).Microseconds() }

func (ck *checker) op(e exchange) history.Op {
	o := history.Op{Kind: history.Charge, Client: e.req.lane, CallUS: ck.us(e.call), ReturnUS: max(ck.us(e.ret), ck.us(e.call)),
		Key: e.req.key, Fingerprint: e.req.fp, Status: e.status, Replayed: e.replayed, Code: problemCode(e.body)}
	if e.ok() {
		o.ChargeID = e.id
	}
	return o
}

// history is every operation recorded, on the check's one time axis.
func (ck *checker) history() history.History {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	return history.History{Run: "check-" + ck.run, Ops: append([]history.Op(nil), ck.ops...)}
}

// settleFor bounds how long a client follows one request's answers.
const settleFor = 5 * time.Second

// settle sends r and follows its answers until a final one.
func (ck *checker) settle(ctx context.Context, r request) exchange {
	return ck.follow(ctx, r, ck.send(ctx, r))
}

// final reports an answer a client stops at: a resource, or a refusal
// that is not "still in progress".
func final(e exchange) bool {
	switch {
	case errors.Is(e.err, errBudget), e.ok():
		return true
	case e.status == http.StatusConflict:
		return !inProgress(e)
	}
	return e.status >= 400 && e.status < 500
}

// follow goes on from e as a client does, for at most settleFor: after a
// 409 in progress it waits its Retry-After and sends r again; after a 202
// it polls the Location once, and sends r again while the operation still
// runs (the key keeps that safe, and a retry is what takes over a claim
// whose worker died); after a 5xx or no answer, it backs off and retries.
func (ck *checker) follow(ctx context.Context, r request, e exchange) exchange {
	until := time.Now().Add(settleFor)
	for backoff := 100 * time.Millisecond; !final(e); backoff = min(2*backoff, time.Second) {
		wait := retryAfter(e.header, backoff)
		if time.Now().Add(wait).After(until) || !sleep(ctx, wait) {
			return e
		}
		if e.status == http.StatusAccepted && e.location != "" {
			if p, done := ck.poll(ctx, r, e.location); done {
				return p
			}
			if time.Now().After(until) {
				return e
			}
		}
		e = ck.send(ctx, r)
	}
	return e
}

// inProgress reports a 409 that says the key is still being processed, as
// the draft's example does; a 409 without a code is taken as one too.
func inProgress(e exchange) bool {
	code := problemCode(e.body)
	return code == "" || strings.Contains(code, "progress") || strings.Contains(code, "in_flight") || strings.Contains(code, "concurrent")
}

// poll reads once the operation a 202 named. It is done when the answer
// names a resource (an id at IDPointer or at OperationID): that is the
// operation's outcome, recorded as a 200 with its id. Otherwise the
// operation still runs (or is gone), recorded as a 202: its outcome is
// still unknown.
func (ck *checker) poll(ctx context.Context, r request, location string) (exchange, bool) {
	g := request{url: location, method: http.MethodGet, header: http.Header{}, key: r.key, fp: r.fp, lane: r.lane}
	for k, vs := range ck.cfg.Header {
		g.header[k] = append([]string(nil), vs...)
	}
	if a := r.header.Get("Authorization"); a != "" {
		g.header.Set("Authorization", a) // the operation is the client's
	}
	p := ck.send(ctx, g) // not recorded as sent: recorded below with what it means
	p.req.record = r.record
	if p.status == http.StatusOK {
		if id := cmpOr(idAt(p.body, ck.cfg.IDPointer), idAt(p.body, ck.cfg.OperationID)); id != "" {
			p.id, p.replayed = id, true
			ck.recordPoll(p, http.StatusOK)
			return p, true
		}
	}
	ck.recordPoll(p, http.StatusAccepted)
	return p, false
}

// recordPoll records a poll as an operation with the status it means.
func (ck *checker) recordPoll(p exchange, status int) {
	if !p.req.record || errors.Is(p.err, errBudget) {
		return
	}
	o := ck.op(p)
	o.Status, o.Code, o.ChargeID = status, "", ""
	if status == http.StatusOK {
		o.ChargeID = p.id
	}
	ck.mu.Lock()
	defer ck.mu.Unlock()
	ck.ops = append(ck.ops, o)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// retryAfter is the answer's Retry-After in seconds, capped at one second
// (a check must stay short), or backoff without one.
func retryAfter(h http.Header, backoff time.Duration) time.Duration {
	if h == nil {
		return backoff
	}
	if s, err := strconv.Atoi(h.Get("Retry-After")); err == nil && s >= 0 {
		return min(time.Duration(s)*time.Second, time.Second)
	}
	return backoff
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// readBack asks the read-back URL for the resources created under key,
// and records the answer as a read of the ledger. ok is false without a
// read-back URL or when its answer cannot be read.
func (ck *checker) readBack(ctx context.Context, key string, token2 bool) (ids []string, ok bool, why string) {
	if ck.cfg.ReadBack == "" {
		return nil, false, "no read-back URL (-readback)"
	}
	h := http.Header{}
	for k, vs := range ck.cfg.Header {
		h[k] = append([]string(nil), vs...)
	}
	if tok := ck.token(token2); tok != "" {
		h.Set("Authorization", "Bearer "+tok)
	}
	u := strings.ReplaceAll(ck.cfg.ReadBack, "{key}", url.QueryEscape(key))
	e := ck.send(ctx, request{url: u, method: http.MethodGet, header: h})
	if e.status != http.StatusOK {
		return nil, false, "the read-back answered " + e.told()
	}
	ids, err := idsAt(e.body, ck.cfg.ReadBackIDs, ck.cfg.IDPointer)
	if err != nil {
		return nil, false, "the read-back's answer: " + err.Error()
	}
	ck.mu.Lock()
	ck.ops = append(ck.ops, history.Op{Kind: history.LedgerRead, CallUS: ck.us(e.call), ReturnUS: ck.us(e.ret),
		Key: history.Key{Tenant: tenantOf(token2), Endpoint: ck.endpoint(), Key: key}, Charges: ids})
	ck.mu.Unlock()
	return ids, true, ""
}

// dial opens a connection to the target's host, TLS included for https.
func (ck *checker) dial(ctx context.Context) (net.Conn, error) {
	addr := ck.target.Host
	if ck.target.Port() == "" {
		if ck.target.Scheme == "https" {
			addr = net.JoinHostPort(ck.target.Hostname(), "443")
		} else {
			addr = net.JoinHostPort(ck.target.Hostname(), "80")
		}
	}
	d := net.Dialer{Timeout: ck.cfg.RequestTimeout}
	if ck.target.Scheme == "https" {
		td := tls.Dialer{NetDialer: &d, Config: &tls.Config{ServerName: ck.target.Hostname(), NextProtos: []string{"http/1.1"}}}
		return td.DialContext(ctx, "tcp", addr)
	}
	return d.DialContext(ctx, "tcp", addr)
}

// lose sends r on a connection of its own and closes it without reading a
// byte of the answer: a response lost on the way back. Its operation has
// no answer, so it may or may not have taken effect.
func (ck *checker) lose(ctx context.Context, r request) error {
	e := exchange{req: r, call: time.Now()}
	defer func() { ck.record(e) }()
	if err := ck.take(); err != nil {
		e.err, e.ret = err, time.Now()
		return err
	}
	hr, err := http.NewRequest(r.method, r.url, bytes.NewReader(r.body))
	if err != nil {
		return err
	}
	hr.Header = r.header.Clone()
	var wire bytes.Buffer
	if err := hr.Write(&wire); err != nil {
		return fmt.Errorf("error writing the request: %w", err)
	}
	conn, err := ck.dial(ctx)
	if err != nil {
		e.err, e.ret = err, time.Now()
		return fmt.Errorf("error connecting to the target: %w", err)
	}
	_, err = conn.Write(wire.Bytes())
	conn.Close()
	e.err, e.ret = errors.New("connection closed by the check right after sending"), time.Now()
	if err != nil {
		return fmt.Errorf("error sending the request: %w", err)
	}
	return nil
}

// storm sends n copies of r at once: n connections opened first, n
// goroutines blocked on one channel, then released together, so the
// requests reach the target as close together as the network allows.
func (ck *checker) storm(ctx context.Context, n int, r request) ([]exchange, error) {
	conns := make(chan net.Conn, n)
	for range n {
		c, err := ck.dial(ctx)
		if err != nil {
			close(conns)
			for c := range conns {
				c.Close()
			}
			return nil, fmt.Errorf("error opening the storm's connections: %w", err)
		}
		conns <- c
	}
	pick := func(ctx context.Context, _, _ string) (net.Conn, error) {
		select {
		case c := <-conns:
			return c, nil
		default:
			return ck.dial(ctx)
		}
	}
	tr := &http.Transport{Proxy: nil, DialContext: pick, DisableKeepAlives: true}
	if ck.target.Scheme == "https" {
		tr.DialTLSContext, tr.DialContext = pick, nil
	}
	defer func() {
		tr.CloseIdleConnections()
		for {
			select {
			case c := <-conns:
				c.Close()
			default:
				return
			}
		}
	}()
	client := &http.Client{Transport: tr, Timeout: ck.cfg.RequestTimeout, CheckRedirect: ck.sameHost}
	out := make([]exchange, n)
	release := make(chan struct{})
	var ready, done sync.WaitGroup
	for i := range n {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ri := r
			ri.lane = ck.lane()
			ready.Done()
			<-release
			out[i] = ck.do(ctx, client, ri)
		}()
	}
	ready.Wait()
	close(release)
	done.Wait()
	return out, nil
}

// fingerprint names a body as the history compares requests: its JSON
// with keys sorted and spaces dropped, so field order and whitespace never
// make two requests differ; a body that is no JSON, byte for byte.
func fingerprint(body []byte) string {
	b := canonical(body)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// problemCode is a problem body's code (or, without one, its type).
func problemCode(body []byte) string {
	var p struct {
		Code string `json:"code"`
		Type string `json:"type"`
	}
	if json.Unmarshal(body, &p) != nil {
		return ""
	}
	if p.Code != "" {
		return p.Code
	}
	if p.Type != "" && p.Type != "about:blank" {
		return p.Type
	}
	return ""
}
