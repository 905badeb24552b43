// Package labtest gives tests the real services (each test its own
// PostgreSQL schema and Redis prefix), started for the test binary by
// WithServices when none is configured, and talks to labs over HTTP.
package labtest

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// Tokens of the demo tenants.
const (
	Acme   = "demo-token-acme"
	Globex = "demo-token-globex"
)

// ServiceURL returns the URL of a service from the environment, where
// WithServices puts the ones it starts. When it is missing the test is
// skipped with the reason, or fails when LAB_REQUIRE_SERVICES=1 (as in CI).
func ServiceURL(tb testing.TB, env, example string) string {
	tb.Helper()
	if v := os.Getenv(env); v != "" {
		return v
	}
	msg := os.Getenv(whyEnv(env))
	if msg == "" {
		msg = env + " is not set (e.g. " + env + "=" + example + ") and this test binary started no such service " +
			"(its TestMain runs the tests through labtest.WithServices)"
	}
	msg = "this test needs the real service: " + msg
	if os.Getenv("LAB_REQUIRE_SERVICES") == "1" {
		tb.Fatal(msg + "; LAB_REQUIRE_SERVICES=1 makes that a failure")
	}
	tb.Skip(msg)
	return ""
}

// optional reports whether the service at env is there, for a test that
// also runs without it, logging why not; under LAB_REQUIRE_SERVICES=1 it
// is always there, and ServiceURL then fails the test when it is missing.
func optional(tb testing.TB, env string) bool {
	tb.Helper()
	if os.Getenv(env) != "" || os.Getenv("LAB_REQUIRE_SERVICES") == "1" {
		return true
	}
	why := os.Getenv(whyEnv(env))
	if why == "" {
		why = env + " is not set"
	}
	tb.Log("without " + env + ": " + why)
	return false
}

// Postgres returns DATABASE_URL and a schema of the test's own, dropped when
// the test ends, so tests never touch each other's rows (or anyone else's).
func Postgres(tb testing.TB) (url, schema string) {
	tb.Helper()
	url = ServiceURL(tb, databaseURL, databaseExample)
	schema = "lab_test_" + strings.ReplaceAll(uuid.NewString()[:13], "-", "")
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			tb.Errorf("dropping schema %s: %v", schema, err)
			return
		}
		defer pool.Close()
		if err := pgdb.DropSchema(ctx, pool, schema); err != nil {
			tb.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return url, schema
}

// Redis returns REDIS_URL and a key prefix of the test's own; the test's
// keys are deleted when it ends, and nothing else is touched.
func Redis(tb testing.TB) (url, prefix string) {
	tb.Helper()
	url = ServiceURL(tb, redisURL, redisExample)
	prefix = "lab-test-" + uuid.NewString()[:8] + ":"
	tb.Cleanup(func() {
		opts, err := goredis.ParseURL(url)
		if err != nil {
			tb.Errorf("parsing REDIS_URL: %v", err)
			return
		}
		client := goredis.NewClient(opts)
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			client.Unlink(ctx, iter.Val())
		}
	})
	return url, prefix
}

// OptionalPostgres is Postgres for a test that also runs without
// PostgreSQL: ok is false, with the reason logged, when there is none.
func OptionalPostgres(tb testing.TB) (url, schema string, ok bool) {
	tb.Helper()
	if !optional(tb, databaseURL) {
		return "", "", false
	}
	url, schema = Postgres(tb)
	return url, schema, true
}

// OptionalRedis is Redis for a test that also runs without Redis: ok is
// false, with the reason logged, when there is none.
func OptionalRedis(tb testing.TB) (url, prefix string, ok bool) {
	tb.Helper()
	if !optional(tb, redisURL) {
		return "", "", false
	}
	url, prefix = Redis(tb)
	return url, prefix, true
}

// LostCommit is a ledger whose Apply commits, then reports a lost
// connection for its first Failures calls, as a COMMIT whose
// acknowledgement never arrived.
type LostCommit struct {
	lab.Ledger
	Failures *atomic.Int32
}

// Apply commits, then maybe pretends the answer was lost.
func (l LostCommit) Apply(ctx context.Context, a lab.Apply) (lab.Charge, error) {
	c, err := l.Ledger.Apply(ctx, a)
	if err != nil || l.Failures.Add(-1) < 0 {
		return c, err
	}
	return lab.Charge{}, errors.New("conn closed")
}

// Clock is a clock a test moves by hand: expiry and backoff without sleeping.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock starts a clock at start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now tells the clock's time; pass it as a lab.Clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Start runs a lab on cfg until the test ends. cfg names its variants: the
// lab tree knows none (tests take them from variants.Builtin).
func Start(tb testing.TB, cfg app.Config) *app.App {
	tb.Helper()
	a, err := app.Start(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("starting lab: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil {
			tb.Errorf("closing lab: %v", err)
		}
	})
	return a
}

// PruneInBatches calls prune until it deletes fewer than limit rows, and
// returns what each call deleted: how a test sees a pruner's batches.
func PruneInBatches(tb testing.TB, prune func(context.Context, time.Time, int) (int, error), before time.Time, limit int) []int {
	tb.Helper()
	var calls []int
	for {
		n, err := prune(tb.Context(), before, limit)
		if err != nil {
			tb.Fatal(err)
		}
		calls = append(calls, n)
		if n < limit {
			return calls
		}
	}
}

// Answer is a store's answer to one attempt.
type Answer struct {
	Out lab.Outcome
	Err error
}

// ChargeAsync sends a to s on a goroutine; its answer comes on the channel.
func ChargeAsync(ctx context.Context, s lab.Store, a lab.Attempt) <-chan Answer {
	done := make(chan Answer, 1)
	go func() {
		out, err := s.Charge(ctx, a)
		done <- Answer{out, err}
	}()
	return done
}

// WantInvalid fails unless err is an *lab.InvalidError with a parameter
// and a reason, naming param when param is not "", and its message is
// UTF-8: what the request parsers and their fuzz targets hold every
// refusal to.
func WantInvalid(tb testing.TB, err error, param string) {
	tb.Helper()
	var ie *lab.InvalidError
	if !errors.As(err, &ie) {
		tb.Fatalf("error %v is a %T, not an *InvalidError", err, err)
	}
	if ie.Param == "" || ie.Reason == "" || param != "" && ie.Param != param {
		tb.Fatalf("InvalidError{%q, %q}: want param %q and a reason", ie.Param, ie.Reason, param)
	}
	if !utf8.ValidString(ie.Error()) {
		tb.Fatalf("error message is not UTF-8: %q", ie.Error())
	}
}
