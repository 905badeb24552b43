package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client talks to a provider over HTTP, as the lab does.
type Client struct {
	base string
	key  string
	hc   *http.Client
}

// NewClient returns a client of the provider whose routes are mounted at
// baseURL, e.g. "http://127.0.0.1:8080/provider", that sends apiKey with
// every call. A nil hc is a client with a 10s timeout.
func NewClient(baseURL, apiKey string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), key: apiKey, hc: hc}
}

// NewTransport returns a transport that keeps up to conns connections to
// one host alive: the standard one keeps two, so a caller with more
// requests in flight at once (the relay's deliveries, the provider's
// webhook senders) would dial anew for most of them and leave the old
// connections in TIME_WAIT. It uses no proxy: the lab and its provider
// talk directly.
func NewTransport(conns int) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.MaxIdleConnsPerHost = max(conns, 1)
	t.MaxIdleConns = max(t.MaxIdleConns, t.MaxIdleConnsPerHost)
	return t
}

// StatusError is an answer outside 2xx.
type StatusError struct {
	Status int
	Code   string // the problem's code, e.g. "idempotency_key_reused"
	Detail string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("provider answered %d %s: %s", e.Status, e.Code, e.Detail)
}

// Capture captures req under key; fault is the Provider-Fault header's
// value ("" sends none). Replayed is true when the provider answered with
// the capture an earlier request made.
func (c *Client) Capture(ctx context.Context, key string, req CaptureRequest, fault string) (Captured, error) {
	h := http.Header{}
	h.Set(KeyHeader, key)
	if fault != "" {
		h.Set(FaultHeader, fault)
	}
	var resp Captured
	if err := c.do(ctx, http.MethodPost, "/captures", h, req, &resp); err != nil {
		return Captured{}, err
	}
	return resp, nil
}

// Receipt sends a receipt; duplicate is true when the provider had it.
func (c *Client) Receipt(ctx context.Context, req ReceiptRequest, fault string) (bool, error) {
	h := http.Header{}
	if fault != "" {
		h.Set(FaultHeader, fault)
	}
	var resp ReceiptResponse
	if err := c.do(ctx, http.MethodPost, "/receipts", h, req, &resp); err != nil {
		return false, err
	}
	return resp.Duplicate, nil
}

func (f Filter) query() string {
	q := url.Values{}
	for k, v := range map[string]string{"namespace": f.Namespace, "run": f.Run, "charge_id": f.ChargeID} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.Limit != 0 {
		q.Set("limit", strconv.Itoa(f.EffectiveLimit()))
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// Stats sums the records f selects, with the provider's counters.
func (c *Client) Stats(ctx context.Context, f Filter) (StatsReport, error) {
	var s StatsReport
	err := c.do(ctx, http.MethodGet, "/stats"+f.query(), nil, nil, &s)
	return s, err
}

// Captures lists the captures f selects, newest first.
func (c *Client) Captures(ctx context.Context, f Filter) ([]Capture, error) {
	var resp struct {
		Captures []Capture `json:"captures"`
	}
	err := c.do(ctx, http.MethodGet, "/captures"+f.query(), nil, nil, &resp)
	return resp.Captures, err
}

// Reset forgets a namespace's records ("" = every record).
func (c *Client) Reset(ctx context.Context, ns string) error {
	if ns == "" {
		return c.do(ctx, http.MethodDelete, "/records", nil, nil, nil)
	}
	return c.do(ctx, http.MethodDelete, "/namespaces/"+url.PathEscape(ns), nil, nil, nil)
}

// SetFaults replaces a namespace's standing faults.
func (c *Client) SetFaults(ctx context.Context, ns string, f Faults) error {
	return c.do(ctx, http.MethodPut, "/faults/"+url.PathEscape(ns), nil, f, nil)
}

// Faults reads a namespace's standing faults.
func (c *Client) Faults(ctx context.Context, ns string) (Faults, error) {
	var f Faults
	err := c.do(ctx, http.MethodGet, "/faults/"+url.PathEscape(ns), nil, nil, &f)
	return f, err
}

// ClearFaults clears a namespace's standing faults.
func (c *Client) ClearFaults(ctx context.Context, ns string) error {
	return c.do(ctx, http.MethodDelete, "/faults/"+url.PathEscape(ns), nil, nil, nil)
}

// Health asks whether the provider answers.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/health", nil, nil, nil)
}

// maxAnswer bounds what the client reads of an answer.
const maxAnswer = 4 << 20

func (c *Client) do(ctx context.Context, method, path string, h http.Header, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("error encoding the body of %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("error building %s %s: %w", method, path, err)
	}
	// Without GetBody the transport cannot resend the request by itself
	// (it would, for a POST with an Idempotency-Key on a reused
	// connection): every send is the caller's decision.
	req.GetBody = nil
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("error sending %s %s to the provider: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("error reading the provider's answer to %s %s: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		se := &StatusError{Status: resp.StatusCode}
		var pr struct{ Code, Detail string }
		if json.Unmarshal(b, &pr) == nil {
			se.Code, se.Detail = pr.Code, pr.Detail
		}
		return se
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("error decoding the provider's answer to %s %s: %w", method, path, err)
	}
	return nil
}
