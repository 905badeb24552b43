package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// process is one real `lab serve` started by the test.
type process struct {
	name string
	url  string
	cmd  *exec.Cmd
	log  *os.File
}

// buildLab returns the lab binary, built once for every test of the
// package that runs it as a process or hands it to a script: parallel
// builds of one package on a cold cache each compile it all, and on a fresh
// machine the cluster script's own build outlasted the test's bound.
func buildLab(t *testing.T) string {
	t.Helper()
	bin, err := builtLab()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// startCluster starts three replicas that know each other, sharing
// PostgreSQL (a schema of the test's own) and Redis (a prefix of its own).
func startCluster(t *testing.T) ([]*process, *pgxpool.Pool) {
	t.Helper()
	dbURL, schema := labtest.Postgres(t)
	redisURL, prefix := labtest.Redis(t)
	bin := buildLab(t)
	ports := labtest.FreePorts(t, 3)
	procs := make([]*process, 3)
	for i := range procs {
		procs[i] = &process{name: fmt.Sprintf("r%d", i+1), url: fmt.Sprintf("http://127.0.0.1:%d", ports[i])}
	}
	for i, p := range procs {
		var peers []string
		for j, q := range procs {
			if j != i {
				peers = append(peers, q.url)
			}
		}
		logf, err := os.Create(filepath.Join(t.TempDir(), p.name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		p.log = logf
		p.cmd = exec.Command(bin, "serve")
		p.cmd.Env = append(os.Environ(),
			"LAB_ADDR="+strings.TrimPrefix(p.url, "http://"), "LAB_REPLICA="+p.name, "LAB_PEERS="+strings.Join(peers, ","),
			"DATABASE_URL="+dbURL, "LAB_PG_SCHEMA="+schema, "REDIS_URL="+redisURL, "LAB_REDIS_PREFIX="+prefix,
			"LAB_EMBEDDED_POSTGRES=off", "LAB_EMBEDDED_REDIS=off", "LAB_LOG_LEVEL=warn")
		p.cmd.Stdout, p.cmd.Stderr = logf, logf
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, p := range procs {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
				_ = p.cmd.Wait()
			}
			p.log.Close()
			if t.Failed() {
				b, _ := os.ReadFile(p.log.Name())
				t.Logf("%s log:\n%s", p.name, b)
			}
		}
	})
	for _, p := range procs {
		waitHealthy(t, p.url)
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return procs, pool
}

// waitHealthy waits for a lab process to answer /health: it says nothing
// when it listens, so the test asks.
func waitHealthy(t *testing.T, base string) {
	t.Helper()
	labtest.Eventually(t, base+" healthy", func() bool {
		r, err := labtest.Send(http.MethodGet, base+"/health", nil, "")
		return err == nil && r.Status == http.StatusOK
	})
}

// ledger counts one key's charges and outbox events for a store, straight
// from PostgreSQL.
func ledger(t *testing.T, pool *pgxpool.Pool, schema, store, key string) (charges, events int) {
	t.Helper()
	err := pool.QueryRow(context.Background(), fmt.Sprintf(`
		SELECT (SELECT count(*) FROM %[1]s.charges WHERE store = $1 AND idempotency_key = $2),
		       (SELECT count(*) FROM %[1]s.outbox o JOIN %[1]s.charges c ON c.id = o.charge_id WHERE c.store = $1 AND c.idempotency_key = $2)`, schema),
		store, key).Scan(&charges, &events)
	if err != nil {
		t.Fatal(err)
	}
	return charges, events
}

func schemaOf(t *testing.T, p *process) string {
	t.Helper()
	for _, kv := range p.cmd.Env {
		if s, ok := strings.CutPrefix(kv, "LAB_PG_SCHEMA="); ok {
			return s
		}
	}
	t.Fatal("no schema")
	return ""
}

func TestThreeProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts three lab processes")
	}
	procs, pool := startCluster(t)
	schema := schemaOf(t, procs[0])

	t.Run("NineRetriesOverThreeReplicas", func(t *testing.T) {
		verdicts := map[string]lab.Verdict{"unsafe": lab.Breaks, "memory": lab.Breaks, "redis": lab.Holds, "postgres": lab.Holds}
		for store, want := range map[string]int{"unsafe": 9, "memory": 3, "redis": 1, "postgres": 1} {
			key := "cluster-" + store
			route := "/charge-idempotent?store=" + store
			if store == "unsafe" {
				route = "/charge-unsafe?account=acct-1"
			}
			r := labtest.Do(t, http.MethodGet, procs[0].url+route+"&replicas=3&attempts=9&key="+key, nil, "")
			if r.Status != http.StatusOK {
				t.Fatalf("%s: %d %s", store, r.Status, r.Body)
			}
			rep := labtest.Decode[experiment.Report](t, r)
			if n, _ := ledger(t, pool, schema, store, key); n != want || rep.ChargesApplied != n || rep.Verdict != verdicts[store] {
				t.Errorf("%s: ledger holds %d charges (report %v, %v), want %d (%s)", store, n, rep.ChargesApplied, rep.Verdict, want, verdicts[store])
			}
			targets := map[string]bool{}
			for _, a := range rep.Timeline {
				targets[strings.Split(a.Target, "/charges")[0]] = true
			}
			if len(targets) != 3 {
				t.Errorf("%s: attempts reached %d replicas, want 3", store, len(targets))
			}
		}
	})

	t.Run("KillReplicaMidRunOnPostgres", func(t *testing.T) {
		const key = "cluster-kill"
		var wg sync.WaitGroup
		final := make([]int, 9)
		// The first attempt goes to r2 alone and owns the key: its
		// transaction stays open for work_ms=600 while the others arrive.
		wg.Go(func() { final[0] = retryUntilAnswered(t, procs, 1, key) })
		// Wait, in PostgreSQL itself, until the owner sits in its open
		// transaction, then until a twin queues behind its row lock.
		waitForLocks(t, pool, schema, "owner", `count(*) FILTER (WHERE a.state = 'idle in transaction') = 1`)
		for i := 1; i < len(final); i++ {
			wg.Go(func() { final[i] = retryUntilAnswered(t, procs, i%3, key) })
		}
		waitForLocks(t, pool, schema, "a waiting twin", `count(*) FILTER (WHERE w.pid IS NOT NULL) >= 1`)
		if err := procs[1].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = procs[1].cmd.Wait()
		wg.Wait()
		for i, status := range final {
			if status != http.StatusCreated {
				t.Errorf("attempt %d ended with %d", i, status)
			}
		}
		if charges, events := ledger(t, pool, schema, "postgres", key); charges != 1 || events != 1 {
			t.Fatalf("ledger: %d charges, %d outbox events; want 1 and 1", charges, events)
		}
		var replica string
		if err := pool.QueryRow(context.Background(), "SELECT replica FROM "+schema+".charges WHERE idempotency_key = $1", key).Scan(&replica); err != nil {
			t.Fatal(err)
		}
		if replica == "r2" {
			t.Fatal("the killed replica's charge survived: its transaction should have rolled back")
		}
	})
}

// waitForLocks polls, bounded, until the sessions that hold a write lock on
// this test's idempotency_requests table satisfy cond, an aggregate over
// a (pg_stat_activity) and w (their ungranted lock waits, if any).
func waitForLocks(t *testing.T, pool *pgxpool.Pool, schema, what, cond string) {
	t.Helper()
	q := `SELECT ` + cond + `
		FROM pg_locks l
		JOIN pg_class c ON c.oid = l.relation
		JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_stat_activity a ON a.pid = l.pid
		LEFT JOIN pg_locks w ON w.pid = l.pid AND NOT w.granted
		WHERE n.nspname = $1 AND c.relname = 'idempotency_requests' AND l.mode = 'RowExclusiveLock' AND l.granted`
	labtest.Eventually(t, "PostgreSQL showing "+what, func() bool {
		var ok bool
		if err := pool.QueryRow(context.Background(), q, schema).Scan(&ok); err != nil {
			t.Fatalf("reading locks: %v", err)
		}
		return ok
	})
}

// retryUntilAnswered is a client retrying one charge: on a dropped
// connection it moves to the next replica; on 409 it waits and retries.
func retryUntilAnswered(t *testing.T, procs []*process, start int, key string) int {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(20 * time.Second)
	target := start
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(http.MethodPost, procs[target].url+"/charges?store=postgres",
			strings.NewReader(`{"account":"acct-1","amount_cents":2500}`))
		req.GetBody = nil // the retries are ours, not the transport's
		req.Header.Set("Authorization", "Bearer "+labtest.Acme)
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Lab-Fault", "slow; work_ms=600")
		resp, err := client.Do(req)
		if err != nil {
			target = (target + 1) % len(procs)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusConflict, http.StatusServiceUnavailable:
			// The client's own backoff before it retries, as a real one
			// paces its retries: what is modelled, not a wait for the test.
			time.Sleep(100 * time.Millisecond)
		default:
			return resp.StatusCode
		}
	}
	t.Errorf("attempt from replica %d never answered", start)
	return 0
}
