package app_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// postWithFault sends a charge carrying a Lab-Fault header and returns the
// transport error when the server dropped the connection.
func postWithFault(t *testing.T, base, store, key, fault string) (*http.Response, error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/charges?store="+store, strings.NewReader(body2500))
	req.Header.Set("Authorization", "Bearer "+labtest.Acme)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set(lab.FaultHeader, fault)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

func TestLostResponseAfterCommitReplays(t *testing.T) {
	a := labtest.Start(t, storeConfig(t, lab.StorePostgres))
	_, err := postWithFault(t, a.URL(), lab.StorePostgres, "k-lost", lab.FaultCrashAfterCharge)
	if err == nil || !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("want a dropped connection, got %v", err)
	}
	if n := keyCharges(t, a, "acme", lab.StorePostgres, "k-lost"); n != 1 {
		t.Fatalf("ledger after the lost response: %d charges, want 1 (committed)", n)
	}
	retry := labtest.Charge(t, a.URL(), lab.StorePostgres, labtest.Acme, "k-lost", body2500)
	again := labtest.Charge(t, a.URL(), lab.StorePostgres, labtest.Acme, "k-lost", body2500)
	if retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "true" || string(retry.Body) != string(again.Body) {
		t.Fatalf("retry: %d replayed=%q %s", retry.Status, retry.Header.Get("Idempotent-Replayed"), retry.Body)
	}
	if n := keyCharges(t, a, "acme", lab.StorePostgres, "k-lost"); n != 1 {
		t.Fatalf("ledger after the retry: %d charges, want 1", n)
	}
}

func TestFaultHeaderRefusedWhenDisabled(t *testing.T) {
	cfg := storeConfig(t, lab.StoreMemory)
	a := labtest.Start(t, cfg)
	resp, err := postWithFault(t, a.URL(), lab.StoreMemory, "k-f", "meteor")
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("unknown fault: %v %v", resp, err)
	}
}
