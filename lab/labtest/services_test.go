package labtest_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb/throwaway"
	"github.com/idempotency-lab/lab/lab/redisdb"
)

// runFunc is a test binary's tests, as WithServices runs them.
type runFunc func() int

func (f runFunc) Run() int { return f() }

// recorder is a test whose skip or failure is noted instead of taken.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()           {}
func (r *recorder) Skip(args ...any)  { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatal(args ...any) { r.failed = fmt.Sprint(args...) }

// unset clears the services' variables for the test, as on a fresh machine.
func unset(t *testing.T) {
	for _, env := range []string{"DATABASE_URL", "REDIS_URL", "LAB_REQUIRE_SERVICES"} {
		t.Setenv(env, "")
	}
}

// TestWithServicesGiven: with the URLs set, as in CI, nothing is started
// and the tests get those URLs.
func TestWithServicesGiven(t *testing.T) {
	const db, rd = "postgres://lab:secret@db.invalid:5432/x", "redis://cache.invalid:6379/0"
	t.Setenv("DATABASE_URL", db)
	t.Setenv("REDIS_URL", rd)
	ran := false
	code := labtest.WithServices(runFunc(func() int {
		ran = true
		if got := labtest.ServiceURL(t, "DATABASE_URL", ""); got != db {
			t.Errorf("DATABASE_URL = %q, want the one given", got)
		}
		if got := labtest.ServiceURL(t, "REDIS_URL", ""); got != rd {
			t.Errorf("REDIS_URL = %q, want the one given", got)
		}
		return 3
	})).Run()
	if !ran || code != 3 {
		t.Fatalf("ran=%v code=%d, want the tests run and their code", ran, code)
	}
	if os.Getenv("DATABASE_URL") != db || os.Getenv("REDIS_URL") != rd {
		t.Fatal("the given URLs changed")
	}
}

// TestWithServicesStarts: with no URLs, the tests get a throwaway cluster
// and a redis-server of their own, not the machine's, both gone after.
func TestWithServicesStarts(t *testing.T) {
	if _, err := throwaway.Find(); err != nil {
		t.Skip(err)
	}
	if _, err := redisdb.FindServer(); err != nil {
		t.Skip(err)
	}
	unset(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var db, rd string
	labtest.WithServices(runFunc(func() int {
		db, rd = os.Getenv("DATABASE_URL"), os.Getenv("REDIS_URL")
		conn, err := pgx.Connect(ctx, db)
		if err != nil {
			t.Fatalf("the started PostgreSQL at %q: %v", db, err)
		}
		defer conn.Close(ctx)
		var dir, maxConns string
		if err := conn.QueryRow(ctx, "SELECT current_setting('data_directory'), current_setting('max_connections')").Scan(&dir, &maxConns); err != nil {
			t.Fatal(err)
		}
		if n, _ := strconv.Atoi(maxConns); !strings.Contains(dir, "lab-pg-") || n < 300 {
			t.Errorf("data directory %s, max_connections %s: want a throwaway cluster with room for parallel tests", dir, maxConns)
		}
		client := goredis.NewClient(mustParse(t, rd))
		defer client.Close()
		if v := client.InfoMap(ctx, "server").Item("Server", "executable"); !strings.Contains(v, "redis-server") {
			t.Errorf("the started Redis at %s runs %q, want redis-server", rd, v)
		}
		return 0
	})).Run()
	if db == "" || rd == "" || strings.Contains(db, ":5432/") || strings.Contains(rd, ":6379/") {
		t.Fatalf("the tests got DATABASE_URL=%q REDIS_URL=%q, want services of their own", db, rd)
	}
	if os.Getenv("DATABASE_URL") != "" || os.Getenv("REDIS_URL") != "" {
		t.Error("the URLs outlive the services")
	}
	if conn, err := pgx.Connect(ctx, db); err == nil {
		conn.Close(ctx)
		t.Errorf("%s still answers after Run", db)
	}
	if conn, err := net.DialTimeout("tcp", mustParse(t, rd).Addr, time.Second); err == nil {
		conn.Close()
		t.Errorf("%s still answers after Run", rd)
	}
}

// TestWithServicesUninstalled: without the servers' binaries, Redis is an
// embedded miniredis, and a test needing PostgreSQL is skipped saying what
// to install, or fails under LAB_REQUIRE_SERVICES=1.
func TestWithServicesUninstalled(t *testing.T) {
	unset(t)
	labtest.WithServicesUninstalled(runFunc(func() int {
		var r recorder
		r.TB = t
		if got := labtest.ServiceURL(&r, "DATABASE_URL", ""); got != "" || r.failed != "" {
			t.Errorf("DATABASE_URL = %q, failed %q: want a skip", got, r.failed)
		}
		want := "PostgreSQL's server binaries (initdb, postgres) are not installed: apt-get install postgresql, or set DATABASE_URL="
		if runtime.GOOS != "linux" {
			want = "set DATABASE_URL"
		}
		if !strings.Contains(r.skipped, want) {
			t.Errorf("skipped with %q, want it to say %q", r.skipped, want)
		}
		t.Setenv("LAB_REQUIRE_SERVICES", "1")
		r = recorder{TB: t}
		labtest.ServiceURL(&r, "DATABASE_URL", "")
		if !strings.Contains(r.failed, want) || !strings.Contains(r.failed, "LAB_REQUIRE_SERVICES=1") {
			t.Errorf("under LAB_REQUIRE_SERVICES=1: failed %q, skipped %q", r.failed, r.skipped)
		}

		rd := labtest.ServiceURL(t, "REDIS_URL", "")
		client := goredis.NewClient(mustParse(t, rd))
		defer client.Close()
		if err := client.Ping(t.Context()).Err(); err != nil {
			t.Errorf("the embedded Redis at %s: %v", rd, err)
		}
		return 0
	})).Run()
	if os.Getenv("REDIS_URL") != "" {
		t.Error("REDIS_URL outlives the embedded Redis")
	}
	t.Setenv("LAB_REQUIRE_SERVICES", "")
	var r recorder
	r.TB = t
	labtest.ServiceURL(&r, "DATABASE_URL", "postgres://example")
	if !strings.Contains(r.skipped, "DATABASE_URL is not set (e.g. DATABASE_URL=postgres://example)") ||
		!strings.Contains(r.skipped, "labtest.WithServices") {
		t.Errorf("outside WithServices, skipped with %q", r.skipped)
	}
}

func mustParse(t *testing.T, u string) *goredis.Options {
	t.Helper()
	opts, err := goredis.ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	opts.MaxRetries = -1
	return opts
}
