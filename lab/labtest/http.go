package labtest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

// Reply is one HTTP answer.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// Do sends one request, failing the test when no answer comes back.
func Do(tb testing.TB, method, url string, header http.Header, body string) Reply {
	tb.Helper()
	return DoWith(tb, http.DefaultClient, method, url, header, body)
}

// DoWith is Do through client.
func DoWith(tb testing.TB, client *http.Client, method, url string, header http.Header, body string) Reply {
	tb.Helper()
	r, err := send(client, method, url, header, body)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

// Send sends one request on a connection of its own and returns the
// transport error instead of failing the test, so goroutines may call it
// and a dropped connection (an injected crash) can be told apart.
func Send(method, url string, header http.Header, body string) (Reply, error) {
	return send(&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, method, url, header, body)
}

func send(client *http.Client, method, url string, header http.Header, body string) (Reply, error) {
	req, err := http.NewRequest(method, url, bytes.NewBufferString(body))
	if err != nil {
		return Reply{}, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		return Reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Reply{}, err
	}
	return Reply{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// Bearer is the header of a call as token; "" is a call without one.
func Bearer(token string) http.Header {
	if token == "" {
		return http.Header{}
	}
	return http.Header{"Authorization": {"Bearer " + token}}
}

// ChargeHeader is the header of POST /charges as token with key (either
// "" for none), plus extra.
func ChargeHeader(token, key string, extra http.Header) http.Header {
	h := Bearer(token)
	h.Set("Content-Type", "application/json")
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	for k, v := range extra {
		h[k] = v
	}
	return h
}

// Charge posts a charge as tenant token with key ("" sends none).
func Charge(tb testing.TB, base string, store lab.StoreName, token, key, body string) Reply {
	tb.Helper()
	return Do(tb, http.MethodPost, base+"/charges?store="+string(store), ChargeHeader(token, key, nil), body)
}

// SendCharge posts a charge on a connection of its own, with extra headers
// (a Lab-Fault, a Lab-Run); a dropped connection (an injected crash) is the
// error.
func SendCharge(base string, store lab.StoreName, token, key, body string, extra http.Header) (Reply, error) {
	return Send(http.MethodPost, base+"/charges?store="+string(store), ChargeHeader(token, key, extra), body)
}

// Decode decodes a reply's JSON body into a T, such as a typed report.
func Decode[T any](tb testing.TB, r Reply) T {
	tb.Helper()
	var v T
	if err := json.Unmarshal(r.Body, &v); err != nil {
		tb.Fatalf("decoding %q: %v", r.Body, err)
	}
	return v
}

// Get GETs url as token ("" for none) and decodes its answer, which must
// be a 200.
func Get[T any](tb testing.TB, url, token string) T {
	tb.Helper()
	r := Do(tb, http.MethodGet, url, Bearer(token), "")
	if r.Status != http.StatusOK {
		tb.Fatalf("GET %s: %d %s", url, r.Status, r.Body)
	}
	return Decode[T](tb, r)
}

// ProblemType is the media type of every error answer (RFC 9457).
const ProblemType = "application/problem+json"

// ProblemBody is an error answer as it is on the wire.
type ProblemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Code   string `json:"code"`
	Detail string `json:"detail"`
	Param  string `json:"param"`
}

// Problem decodes an error answer, failing the test unless it is a
// problem+json with a status and a code.
func Problem(tb testing.TB, r Reply) ProblemBody {
	tb.Helper()
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, ProblemType) {
		tb.Fatalf("answer %d %s %q is no problem+json", r.Status, ct, r.Body)
	}
	p := Decode[ProblemBody](tb, r)
	if p.Status != r.Status || p.Code == "" || p.Type == "" || p.Title == "" {
		tb.Fatalf("answer %d %q: a problem needs its status, a code, a type and a title", r.Status, r.Body)
	}
	return p
}

// WantProblem checks that r is the problem status with code, naming param
// when it is not "". A mismatch is an error (the test goes on).
func WantProblem(tb testing.TB, what string, r Reply, status int, code, param string) {
	tb.Helper()
	if r.Status != status || !strings.HasPrefix(r.Header.Get("Content-Type"), ProblemType) {
		tb.Errorf("%s: %d %s %s, want %d problem+json", what, r.Status, r.Header.Get("Content-Type"), r.Body, status)
		return
	}
	p := Decode[ProblemBody](tb, r)
	if p.Code != code || p.Status != status || param != "" && p.Param != param {
		tb.Errorf("%s: problem %+v, want code %s naming %q", what, p, code, param)
	}
}

// Eventually waits until cond holds, for what only polling can see: the
// state of another process (a replica, a redis-server, a browser), or of
// a whole lab seen from outside (its relay, its provider and its webhook
// receiver at work behind its HTTP routes). Code under test in the test's
// own process signals instead (lab/testsignal). cond is checked at once,
// then at a growing interval up to 50ms; the test fails only as the test
// binary's deadline nears (testsignal.Expiry): no wait has a clock of its own.
func Eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	expired, stop := testsignal.Expiry(tb)
	defer stop()
	for wait := time.Millisecond; !cond(); wait = min(2*wait, 50*time.Millisecond) {
		select {
		case <-expired:
			tb.Fatalf("%s: never, and the test binary's deadline is near", what)
		case <-tb.Context().Done():
			tb.Fatalf("%s: %v", what, tb.Context().Err())
		case <-time.After(wait):
		}
	}
}
