//go:build linux

package throwaway_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idempotency-lab/lab/lab/pgdb/throwaway"
)

// requireBinaries skips when PostgreSQL is not installed, unless the run
// demands real services.
func requireBinaries(t *testing.T) {
	t.Helper()
	if _, err := throwaway.Find(); err != nil {
		if os.Getenv("LAB_REQUIRE_SERVICES") == "1" {
			t.Fatalf("LAB_REQUIRE_SERVICES=1 but PostgreSQL server binaries are missing: %v", err)
		}
		t.Skipf("skipping: PostgreSQL server binaries not installed (set LAB_REQUIRE_SERVICES=1 to fail instead): %v", err)
	}
}

func TestFind(t *testing.T) {
	requireBinaries(t)
	dir, err := throwaway.Find()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("Find returned %s without %s: %v", dir, name, err)
		}
	}
}

func TestStartUseClose(t *testing.T) {
	requireBinaries(t)
	defer goleak.VerifyNone(t)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))

	c, err := throwaway.Start(ctx, logger, "max_connections=300")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = c.Close()
		}
	}()

	if !strings.HasPrefix(c.URL(), "postgres://postgres@127.0.0.1:") || !strings.HasSuffix(c.URL(), "/lab?sslmode=disable") {
		t.Errorf("URL() = %q, want postgres://postgres@127.0.0.1:PORT/lab?sslmode=disable", c.URL())
	}
	pid := c.PID()
	if pid <= 0 {
		t.Fatalf("PID() = %d, want a positive pid", pid)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("postmaster pid %d not alive while running: %v", pid, err)
	}

	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
	var db, dataDir string
	if err := conn.QueryRow(ctx, "SELECT current_database(), current_setting('data_directory')").Scan(&db, &dataDir); err != nil {
		t.Fatalf("query settings: %v", err)
	}
	if db != "lab" {
		t.Errorf("current_database() = %q, want lab", db)
	}
	var maxConns string
	if err := conn.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns); err != nil || maxConns != "300" {
		t.Errorf("max_connections = %q, %v; want the 300 asked, over the default 200", maxConns, err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY, v text)"); err != nil {
		t.Fatalf("create table: %v", err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO t VALUES ($1, $2)", 1, "x"); err != nil {
		t.Fatalf("insert: %v", err)
	}
	var v string
	if err := conn.QueryRow(ctx, "SELECT v FROM t WHERE id = 1").Scan(&v); err != nil || v != "x" {
		t.Fatalf("select inserted row = %q, %v", v, err)
	}
	// Leave the connection open: Close must stop a server with clients.

	tempDir := filepath.Dir(dataDir)
	if !strings.HasPrefix(filepath.Base(tempDir), "lab-pg-") {
		t.Fatalf("data directory %s is not inside a lab-pg-* temp dir", dataDir)
	}

	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	closed = true
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	_ = conn.Close(ctx)

	if _, err := os.Stat(tempDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s still exists after Close (stat err: %v)", tempDir, err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("postmaster pid %d: kill(0) = %v after Close, want ESRCH", pid, err)
	}
}

func TestStartCanceled(t *testing.T) {
	requireBinaries(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c, err := throwaway.Start(ctx, nil)
	if err == nil {
		_ = c.Close()
		t.Fatal("Start with a canceled context succeeded")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Start error = %v, want it to wrap context.Canceled", err)
	}
}
