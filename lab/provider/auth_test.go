package provider_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/provider"
)

// TestAPIKey: the provider's routes answer only callers with its API key.
// A local process without it (the attack of an open provider: read every
// namespace's captures, set another's faults, delete records, post a
// capture for a charge) gets 401 and changes nothing; /health stays open.
func TestAPIKey(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	ctx := context.Background()
	if _, err := e.client.Capture(ctx, "k1", captureReq("acme", "ch_1", 1_000_000), ""); err != nil {
		t.Fatal(err)
	}
	// send makes one request with the given Authorization lines.
	send := func(t *testing.T, method, path string, auth []string, header http.Header, body string) labtest.Reply {
		t.Helper()
		req, err := http.NewRequest(method, e.base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header[k] = v
		}
		req.Header["Authorization"] = auth
		resp, err := e.hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		return labtest.Reply{Status: resp.StatusCode, Header: resp.Header}
	}
	routes := []struct {
		method, path string
		header       http.Header
		body         string
	}{
		{http.MethodPost, "/captures", keyed("attacker-1", ""), body(captureReq("acme", "ch_1", 1))},
		{http.MethodPost, "/captures", keyed("attacker-2", "down"), body(captureReq("acme", "ch_1", 1))},
		{http.MethodPost, "/captures", keyed("attacker-3", "decline"), body(captureReq("acme", "ch_1", 1))},
		{http.MethodPost, "/receipts", keyed("", ""), body(provider.ReceiptRequest{EventID: "evt-x", ChargeID: "ch_1", Namespace: "acme", Tenant: "acme", Via: provider.ViaOutbox})},
		{http.MethodGet, "/captures", nil, ""},
		{http.MethodGet, "/stats", nil, ""},
		{http.MethodDelete, "/namespaces/acme", nil, ""},
		{http.MethodDelete, "/records", nil, ""},
		{http.MethodPut, "/faults/acme", keyed("", ""), `{"decline":true}`},
		{http.MethodGet, "/faults/acme", nil, ""},
		{http.MethodDelete, "/faults/acme", nil, ""},
	}
	for _, auth := range [][]string{nil, {""}, {"Bearer"}, {"Bearer "}, {"Bearer wrong-key"}, {apiKey}, {"Basic " + apiKey},
		{"Bearer " + apiKey + "x"}, {"bearer " + apiKey}} {
		for _, r := range routes {
			got := send(t, r.method, r.path, auth, r.header, r.body)
			if got.Status != http.StatusUnauthorized || got.Header.Get("Content-Type") != "application/problem+json" ||
				!strings.HasPrefix(got.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s %s with Authorization %q: %d %s, want 401 problem", r.method, r.path, auth, got.Status, got.Header)
			}
		}
	}
	problemOf(t, e.do(t, http.MethodGet, "/stats", http.Header{"Authorization": {"Bearer nope"}}, ""), http.StatusUnauthorized, "unauthenticated")
	// Nothing changed: one capture of 1,000,000 cents, no receipt, no fault.
	list, err := e.client.Captures(ctx, provider.Filter{})
	if err != nil || len(list) != 1 || list[0].AmountCents != 1_000_000 || list[0].Requests != 1 {
		t.Fatalf("captures %+v (%v): want the one capture made with the key, untouched", list, err)
	}
	if s := e.stats(t, ""); s.Receipts != 0 {
		t.Fatalf("stats %+v: a receipt was recorded without the key", s)
	}
	if f, err := e.client.Faults(ctx, "acme"); err != nil || f != (provider.Faults{}) {
		t.Fatalf("faults %+v (%v): set without the key", f, err)
	}
	if c := e.p.Counters(); c.ConnectionsDropped != 0 {
		t.Fatalf("counters %+v: the down fault acted without the key", c)
	}
	// The liveness probe needs no key.
	if got := send(t, http.MethodGet, "/health", nil, nil, ""); got.Status != http.StatusOK {
		t.Fatalf("GET /health without a key: %d", got.Status)
	}
	// A client with another key is refused as well.
	other := provider.NewClient(e.base, "another-key", e.hc)
	_, err = other.Capture(ctx, "attacker-4", captureReq("acme", "ch_1", 1), "")
	statusError(t, err, http.StatusUnauthorized, "unauthenticated")
}
