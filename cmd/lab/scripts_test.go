package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants"
)

// scriptNeedTools skips the test when a tool the scripts call is missing.
func scriptNeedTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the script needs it", tool)
		}
	}
}

// runScript runs a script under bash with extra environment until it
// exits: the test binary's -timeout is its only bound. Shortly before that
// deadline it gets SIGTERM (so it stops what it started), then SIGKILL
// after a grace period. It returns the combined output and the exit code.
func runScript(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := beforeDeadline(t)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = scriptGrace
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Errorf("%s was still running as the test binary's deadline neared", args[0])
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode()
	}
	t.Fatalf("running %s: %v\n%s", args[0], err, out.String())
	return "", -1
}

// scriptGrace is how long a script has to stop what it started once told.
const scriptGrace = 30 * time.Second

// beforeDeadline is the test's context, ended early enough before the test
// binary's deadline (go test -timeout) that a script told to stop can still
// clean up and the test report why; without a deadline it ends with the test.
func beforeDeadline(t *testing.T) (context.Context, context.CancelFunc) {
	deadline, ok := t.Deadline()
	if !ok {
		return context.WithCancel(t.Context())
	}
	return context.WithDeadline(t.Context(), deadline.Add(-2*scriptGrace))
}

// scriptPIDs reads a line the script prints, such as "cluster pids: 1 2 3 4",
// whose prefix is given.
func scriptPIDs(t *testing.T, out, prefix string) []int {
	t.Helper()
	for line := range strings.Lines(out) {
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		var pids []int
		for f := range strings.FieldsSeq(rest) {
			pid, err := strconv.Atoi(f)
			if err != nil || pid <= 1 {
				t.Fatalf("bad pid %q in %q", f, line)
			}
			pids = append(pids, pid)
		}
		return pids
	}
	return nil
}

// scriptGone reports each of pids that is still alive (and kills it).
func scriptGone(t *testing.T, what string, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s process %d started by the script is still there after it exited (kill -0: %v); killing it", what, pid, err)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// scriptComparison reads the script's design comparison table (store,
// attempts, replicas, charges_applied, verdict, explanation): its rows'
// fields by store, and the stores in the order listed.
func scriptComparison(out string) (rows map[string][]string, stores []string) {
	rows, in := map[string][]string{}, false
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		switch {
		case !in:
			in = len(f) >= 2 && f[0] == "store" && f[1] == "attempts"
		case len(f) == 0:
			return rows, stores
		case len(f) >= 5:
			rows[f[0]] = f
			stores = append(stores, f[0])
		}
	}
	return rows, stores
}

// scriptMatrixRow returns the cells of the matrix table's row whose case
// title is given: a verdict and the charges (3/1) per store.
func scriptMatrixRow(out, title string) []string {
	for line := range strings.Lines(out) {
		if rest, ok := strings.CutPrefix(line, title); ok {
			return strings.Fields(rest)
		}
	}
	return nil
}

// clusterScriptEnv is cluster.sh's environment for one test: free ports,
// a PostgreSQL schema and a Redis prefix of its own (dropped when the test
// ends), no admin token, and the binary built for the package.
func clusterScriptEnv(t *testing.T) (env []string, dbURL, schema, prefix string) {
	t.Helper()
	dbURL, schema = labtest.Postgres(t)
	redisURL, prefix := labtest.Redis(t)
	ports := labtest.FreePorts(t, 4)
	return []string{
		fmt.Sprintf("CLUSTER_PORTS=%d %d %d", ports[0], ports[1], ports[2]), fmt.Sprintf("FRONT_PORT=%d", ports[3]),
		"DATABASE_URL=" + dbURL, "REDIS_URL=" + redisURL, "LAB_PG_SCHEMA=" + schema, "LAB_REDIS_PREFIX=" + prefix,
		"LAB_ADMIN_TOKEN=", // the cluster's replicas and the reset agree: none
		"LAB_BIN=" + buildLab(t),
	}, dbURL, schema, prefix
}

func TestClusterScript(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a three-replica cluster and runs the breakage matrix; not in -short")
	}
	scriptNeedTools(t, "bash", "go", "curl", "python3")
	_, errServer := exec.LookPath("redis-server")
	_, errCLI := exec.LookPath("redis-cli")
	withPair := errServer == nil && errCLI == nil
	env, _, schema, prefix := clusterScriptEnv(t)
	// The script starts its own Redis pair (on ports it picks) when it can.
	env = append(env, "CLUSTER_REDIS_PAIR=on", "CLUSTER_REDIS_PAIR_PORTS=", "LAB_REDIS_PAIR_PRIMARY=", "LAB_REDIS_PAIR_REPLICA=")
	out, code := runScript(t, env, "../../scripts/cluster.sh")
	t.Logf("cluster.sh output:\n%s", out)

	pids := scriptPIDs(t, out, "cluster pids:")
	if len(pids) != 4 {
		t.Errorf("want 4 pids (3 replicas and the front) on a line 'cluster pids: ...', got %v", pids)
	}
	scriptGone(t, "lab", pids)
	pairPIDs := scriptPIDs(t, out, "redis pair pids:")
	if withPair && len(pairPIDs) != 2 {
		t.Errorf("want 2 pids (the Redis primary and replica) on a line 'redis pair pids: ...', got %v", pairPIDs)
	}
	scriptGone(t, "Redis pair", pairPIDs)
	if code != 0 {
		t.Fatalf("cluster.sh exited %d", code)
	}

	rows, stores := scriptComparison(out)
	var designs []string
	for _, v := range variants.Builtin() {
		designs = append(designs, string(v.Name))
	}
	if !slices.Equal(stores, designs) {
		t.Errorf("the comparison lists %v; want every registered design: %v", stores, designs)
	}
	for _, want := range []struct {
		store, charges, verdict string
	}{
		{"unsafe", "9", "breaks"},
		{"look-first", "9", "breaks"}, // all nine looked before any wrote
		{"memory", "3", "breaks"},     // one charge per replica: each has its own map
		{"redis", "1", "holds"},
		{"postgres", "1", "holds"},
		{"lease", "1", "holds"},
		{"redis+postgres", "1", "holds"},
	} {
		row := rows[want.store]
		if row == nil {
			t.Errorf("no %s row in the comparison table", want.store)
			continue
		}
		if got := row[1:5]; got[0] != "9" || got[1] != "3" || got[2] != want.charges || got[3] != want.verdict {
			t.Errorf("%s: attempts, replicas, charges, verdict = %v; want 9 3 %s %s", want.store, got, want.charges, want.verdict)
		}
	}

	var failover string
	for _, c := range experiment.Cases() {
		if c.Name == "redis_failover" {
			failover = c.Title
		}
	}
	cells := scriptMatrixRow(out, failover)
	switch {
	case cells == nil:
		t.Errorf("no failover row (%q) in the matrix", failover)
	case withPair:
		// Every design ran against the pair: a verdict and its charges for each.
		ok := len(cells) == 2*len(designs)
		for i := 0; ok && i < len(cells); i += 2 {
			ok = (cells[i] == "holds" || cells[i] == "breaks") && strings.Contains(cells[i+1], "/")
		}
		if !ok {
			t.Errorf("failover row: %v; want a verdict and charges for each of the %d designs, no n/a", cells, len(designs))
		}
	default:
		if !strings.Contains(out, "the failover row stays n/a: install redis-") {
			t.Errorf("without redis-server the output does not say why the failover row stays n/a")
		}
	}

	wants := []string{"9 concurrent retries over 3 replicas", "cluster stopped: 4 processes",
		"dropped schema " + schema, "deleted the Redis keys under " + prefix}
	if withPair {
		wants = append(wants, "redis pair stopped: 2 processes")
	}
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestWalkthroughScript(t *testing.T) {
	t.Parallel()
	scriptNeedTools(t, "bash", "curl", "python3")
	const steps = "walkthrough passed: 14 steps"

	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		a := startLab(t) // memory store and ledger only
		out, code := runScript(t, []string{"LAB_ADMIN_TOKEN=", "WALKTHROUGH_STORE="}, "../../scripts/walkthrough.sh", a.URL())
		t.Logf("walkthrough.sh output:\n%s", out)
		if code != 0 {
			t.Fatalf("walkthrough.sh exited %d", code)
		}
		for _, want := range []string{
			"ok: charges_applied = 5", "ok: overcharged_cents = 10000", "ok: charges_applied = 1",
			"ok: duplicates_prevented = 4", "ok: charges_applied = 0", "ok: Idempotent-Replayed: true",
			"ok: HTTP 422", "ok: code = idempotency_key_missing", "ok: param = amount",
			"$ curl -sS '" + a.URL() + "/charge-unsafe?attempts=5'", steps,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q", want)
			}
		}
	})

	t.Run("admin token", func(t *testing.T) {
		t.Parallel()
		const secret = "walkthrough-admin-secret"
		a := startLab(t, func(c *app.Config) { c.AdminToken = secret })
		// The walkthrough acts in the public namespace, whose reset needs no token.
		out, code := runScript(t, []string{"LAB_ADMIN_TOKEN=", "WALKTHROUGH_STORE="}, "../../scripts/walkthrough.sh", a.URL())
		if code != 0 || !strings.Contains(out, steps) {
			t.Errorf("without the token: exit %d, want the public namespace's walkthrough to pass:\n%s", code, out)
		}
		out, code = runScript(t, []string{"LAB_ADMIN_TOKEN=" + secret, "WALKTHROUGH_STORE="}, "../../scripts/walkthrough.sh", a.URL())
		if code != 0 || !strings.Contains(out, steps) {
			t.Errorf("with the token: exit %d:\n%s", code, out)
		}
		if strings.Contains(out, secret) {
			t.Errorf("the admin token is printed in clear:\n%s", out)
		}
		if !strings.Contains(out, `-H "Authorization: Bearer $LAB_ADMIN_TOKEN"`) {
			t.Errorf("the reset command does not show the token as $LAB_ADMIN_TOKEN:\n%s", out)
		}
	})

	t.Run("no lab", func(t *testing.T) {
		t.Parallel()
		url := fmt.Sprintf("http://127.0.0.1:%d", labtest.FreePorts(t, 1)[0])
		out, code := runScript(t, []string{"LAB_ADMIN_TOKEN=", "WALKTHROUGH_STORE="}, "../../scripts/walkthrough.sh", url)
		if code == 0 || !strings.Contains(out, "FAILED at step 1") || !strings.Contains(out, "is the lab running?") {
			t.Errorf("against %s with nothing listening: exit %d, want non-zero and a clear message:\n%s", url, code, out)
		}
	})
}

// TestClusterScriptInterrupted: Ctrl-C while the script's matrix runs
// (SIGINT to its whole process group, as a terminal sends it) stops every
// process it started, drops its data and exits 130, a requested stop: no
// failure reported, no logs dumped.
func TestClusterScriptInterrupted(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a three-replica cluster; not in -short")
	}
	scriptNeedTools(t, "bash", "go", "curl", "python3")
	env, dbURL, schema, _ := clusterScriptEnv(t)
	cmd := exec.Command("bash", "../../scripts/cluster.sh")
	cmd.Env = append(append(os.Environ(), env...), "CLUSTER_REDIS_PAIR=off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a group of its own, as a terminal's foreground job
	cmd.WaitDelay = scriptGrace
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var out strings.Builder
	matrixRunning := make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.HasPrefix(sc.Text(), "breakage matrix") {
				close(matrixRunning)
			}
		}
	}()
	select {
	case <-matrixRunning:
		// The matrix has started once it charged: the ledger grows past
		// what the comparison before it left.
		conn, err := pgx.Connect(t.Context(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		charges := func() (n int) {
			if err := conn.QueryRow(t.Context(), fmt.Sprintf(`SELECT count(*) FROM %q.charges`, schema)).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := charges()
		labtest.Eventually(t, "the matrix's first charge", func() bool { return charges() > before })
	case <-read:
		t.Fatalf("cluster.sh ended before its matrix:\n%s", out.String())
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waited := cmd.Wait()
	<-read
	t.Logf("cluster.sh output:\n%s", out.String())
	var exit *exec.ExitError
	if !errors.As(waited, &exit) || exit.ExitCode() != 130 {
		t.Errorf("cluster.sh after Ctrl-C: %v; want exit status 130", waited)
	}
	got := out.String()
	scriptGone(t, "lab", scriptPIDs(t, got, "cluster pids:"))
	// The matrix's lab process gets the Ctrl-C and, from the script's
	// cleanup, a SIGTERM; on a loaded machine either may reach it first:
	// both are a requested stop.
	for _, want := range []string{"cluster.sh: interrupted, stopping", "lab: stopped: ", "cluster stopped: 4 processes", "dropped schema " + schema} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	for _, failure := range []string{"--- last lines of", "lab matrix failed", "FAILED", "error asking"} {
		if strings.Contains(got, failure) {
			t.Errorf("a requested stop reported as a failure: output has %q", failure)
		}
	}
}
