package redisdb_test

import (
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab/redisdb"
)

// TestThrowawayStartUseClose: a throwaway server answers at its URL, keeps
// nothing on disk, and is gone, directory and all, after Close.
func TestThrowawayStartUseClose(t *testing.T) {
	if _, err := redisdb.FindServer(); err != nil {
		if os.Getenv("LAB_REQUIRE_SERVICES") == "1" {
			t.Fatalf("%v; LAB_REQUIRE_SERVICES=1 makes that a failure", err)
		}
		t.Skip(err)
	}
	ctx := t.Context()
	s, err := redisdb.StartThrowaway(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	opts, err := goredis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(opts)
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, "k").Val(); v != "v" {
		t.Fatalf("get: %q", v)
	}
	if pid := c.InfoMap(ctx, "server").Item("Server", "process_id"); pid == "" || pid != strconv.Itoa(s.PID()) {
		t.Fatalf("the server at %s is pid %q, want %d", s.URL(), pid, s.PID())
	}
	for name, want := range map[string]string{"save": "", "appendonly": "no", "bind": "127.0.0.1"} {
		if got := c.ConfigGet(ctx, name).Val()[name]; got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	dir := c.ConfigGet(ctx, "dir").Val()["dir"]
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the server's directory: %v", err)
	}

	s.Close()
	s.Close() // idempotent
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists after Close (%v)", dir, err)
	}
	if conn, err := net.DialTimeout("tcp", opts.Addr, time.Second); err == nil {
		conn.Close()
		t.Errorf("%s still answers after Close", opts.Addr)
	}
}
