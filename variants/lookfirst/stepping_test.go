package lookfirst_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/variants/lookfirst"
)

// TestSteppedState: the map holds nothing while an attempt looks (the
// design's flaw: a look leaves no mark), the answer once recorded, and
// nothing again once the window move passed; a retry then charges again.
func TestSteppedState(t *testing.T) {
	books := inmem.NewBooks(time.Now)
	s, err := lookfirst.New(books, time.Now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	req := lab.ChargeRequest{Account: "acct-1", AmountCents: 100, Currency: "USD"}
	a := lab.Attempt{Scope: lab.Scope{Namespace: "ns", Tenant: "acme", Endpoint: lab.Endpoint, Key: "k-step"},
		Request: req, Fingerprint: req.Fingerprint(), Store: lookfirst.Name}
	state := func(want string) {
		t.Helper()
		in, err := s.Inspect(t.Context(), a.Scope)
		if err != nil || in.State != want || len(in.Facts) == 0 {
			t.Fatalf("inspect: %+v %v, want %s", in, err, want)
		}
	}
	state(lab.KeyAbsent)
	if _, err := s.Charge(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	state(lab.KeyCompleted)
	if err := s.MakeHappen(t.Context(), a.Scope, lab.EventWindow); err != nil {
		t.Fatal(err)
	}
	state(lab.KeyAbsent)
	if out, err := s.Charge(t.Context(), a); err != nil || out.Replayed {
		t.Fatalf("the retry after the window: %+v %v", out, err)
	}
	k, err := books.KeyCharges(t.Context(), "acme", lookfirst.Name, "k-step")
	if err != nil || k.Charges != 2 {
		t.Fatalf("the books hold %d charges (%v), want 2", k.Charges, err)
	}
	var invalid *lab.InvalidError
	if err := s.MakeHappen(t.Context(), a.Scope, lab.EventTTL); !errors.As(err, &invalid) || !strings.Contains(err.Error(), "ttl") {
		t.Fatalf("a ttl move on look-first: %v", err)
	}
}
