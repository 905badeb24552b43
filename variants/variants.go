// Package variants registers the lab's idempotency designs, in the order
// the lab presents them. Adding a design is a package under variants/ and
// one line here.
package variants

import (
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants/lease"
	"github.com/idempotency-lab/lab/variants/lookfirst"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/phases"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
	"github.com/idempotency-lab/lab/variants/rediscache"
	"github.com/idempotency-lab/lab/variants/unsafestore"
)

// Builtin returns every design the lab ships, in the lesson's order: no key
// at all, a key looked up before acting (the race), then the claims that
// close the race, one replica to many, and the request in atomic phases
// whose provider call is part of it.
func Builtin() []variant.Variant {
	return []variant.Variant{
		unsafestore.Variant(),
		lookfirst.Variant(),
		memory.Variant(),
		redis.Variant(),
		postgres.Variant(),
		lease.Variant(),
		phases.Variant(),
		rediscache.Variant(),
	}
}
