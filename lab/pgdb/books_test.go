package pgdb_test

import (
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/labtest/bookstest"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// TestBooks holds the PostgreSQL books to the cases every books meet,
// each case in a schema of its own.
func TestBooks(t *testing.T) {
	t.Parallel()
	bookstest.Exercise(t, func(t *testing.T, now lab.Clock) bookstest.Books {
		url, schema := labtest.Postgres(t)
		pool, err := pgdb.Open(t.Context(), pgdb.PoolConfig{URL: url, Schema: schema, Size: 2, AppName: "books-test", Migrate: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pgdb.NewBooks(pool, now)
	})
}
