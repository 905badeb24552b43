package e2e_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/lease"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
	"github.com/idempotency-lab/lab/variants/rediscache"
)

// TestKeyLookupShowsTheStoredResponse: /idempotency/state?key= on every
// keyed store answers the key's state, fingerprint and the very response a
// retry would replay; a key never used is absent and shows nothing else.
func TestKeyLookupShowsTheStoredResponse(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.FullConfig(t))
	h := labtest.Bearer(labtest.Acme)
	type state struct {
		Seen        string          `json:"key_state"`
		State       string          `json:"state"`
		Key         string          `json:"key"`
		Fingerprint string          `json:"fingerprint"`
		Status      int             `json:"response_status"`
		Response    json.RawMessage `json:"response"`
	}
	for _, store := range []lab.StoreName{memory.Name, redis.Name, postgres.Name, lease.Name, rediscache.Name} {
		first := labtest.Charge(t, a.URL(), store, labtest.Acme, "k-inspect", e2e.Body2500)
		if first.Status != http.StatusCreated {
			t.Fatalf("%s: %d %s", store, first.Status, first.Body)
		}
		got := labtest.Decode[state](t, labtest.Do(t, http.MethodGet, a.URL()+"/idempotency/state?store="+string(store)+"&key=k-inspect", h, ""))
		var stored, answered bytes.Buffer
		_ = json.Compact(&stored, got.Response)
		_ = json.Compact(&answered, first.Body)
		if got.Seen != lab.KeyCompleted || got.State != lab.KeyCompleted || got.Key != "k-inspect" || len(got.Fingerprint) != 64 ||
			got.Status != http.StatusCreated || stored.String() != answered.String() {
			t.Errorf("%s: lookup %+v (response %s), want completed with the answer %s", store, got, got.Response, first.Body)
		}
		retry := labtest.Charge(t, a.URL(), store, labtest.Acme, "k-inspect", e2e.Body2500)
		if !bytes.Equal(retry.Body, first.Body) || retry.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s: the retry answered %s", store, retry.Body)
		}
		none := labtest.Decode[state](t, labtest.Do(t, http.MethodGet, a.URL()+"/idempotency/state?store="+string(store)+"&key=k-never", h, ""))
		if none.Seen != lab.KeyAbsent || none.Fingerprint != "" || none.Status != 0 || len(none.Response) != 0 {
			t.Errorf("%s: an unused key looks like %+v", store, none)
		}
	}
}
