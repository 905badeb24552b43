package app_test

import (
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
)

// idempotentStores lists the idempotent stores this test run covers.
func idempotentStores(t *testing.T) []string {
	t.Helper()
	return []string{lab.StoreMemory}
}

// storeConfig returns a lab configuration in which store is available.
func storeConfig(t *testing.T, store string) app.Config {
	t.Helper()
	return app.Config{}
}
