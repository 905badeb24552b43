package inmem_test

import (
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/labtest/bookstest"
)

// TestBooks holds the in-memory books to the cases every books meet.
func TestBooks(t *testing.T) {
	t.Parallel()
	bookstest.Exercise(t, func(_ *testing.T, now lab.Clock) bookstest.Books { return inmem.NewBooks(now) })
}
