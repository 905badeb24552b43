package memory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/inmem"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants/conformance"
	"github.com/idempotency-lab/lab/variants/memory"
)

func TestConformance(t *testing.T) { conformance.Exercise(t, memory.Variant()) }

// TestConformancePlain holds the plain path (-plain-paths on: store.go
// alone) to the same declaration as the packed store the lab runs by
// default.
func TestConformancePlain(t *testing.T) {
	v := memory.Variant()
	open := v.Open
	v.Open = func(ctx context.Context, d variant.Deps) (lab.Store, error) {
		d.Plain = true
		s, err := open(ctx, d)
		if _, plain := s.(*memory.Store); err == nil && !plain {
			t.Errorf("with Plain set, the variant opened a %T, not the plain *memory.Store", s)
		}
		return s, err
	}
	conformance.Exercise(t, v)
}

// TestPlainPathsOpenTheStoreAlone: -plain-paths on (Deps.Plain) runs
// store.go alone; otherwise the lab runs the packed store.
func TestPlainPathsOpenTheStoreAlone(t *testing.T) {
	t.Parallel()
	for plain, want := range map[bool]string{true: "*memory.Store", false: "*memory.Packed"} {
		s, err := memory.Variant().Open(t.Context(), variant.Deps{Plain: plain, Ledger: inmem.NewBooks(time.Now), Clock: time.Now,
			Window: time.Hour, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%T", s); got != want {
			t.Errorf("Plain=%v opened a %s, want a %s", plain, got, want)
		}
	}
	if s, err := memory.Variant().Open(t.Context(), variant.Deps{Plain: true}); err == nil || s != nil {
		t.Fatalf("without a ledger: %v, %v; want an error and no store", s, err)
	}
}
