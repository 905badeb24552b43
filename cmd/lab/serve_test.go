package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb/throwaway"
	"github.com/idempotency-lab/lab/lab/testsignal"
)

// TestZeroConfigServe runs the binary as the README's first command does —
// no DATABASE_URL, no REDIS_URL — and checks it serves every store from its
// embedded services, then leaves no process or directory behind on SIGINT.
func TestZeroConfigServe(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts the binary and a PostgreSQL cluster")
	}
	if _, err := throwaway.Find(); err != nil {
		if os.Getenv("LAB_REQUIRE_SERVICES") == "1" {
			t.Fatalf("PostgreSQL server binaries are required: %v", err)
		}
		t.Skip("PostgreSQL's server binaries (initdb, postgres) are not installed: apt-get install postgresql")
	}
	bin := buildLab(t)
	port := labtest.FreePorts(t, 1)[0]
	cmd := exec.Command(bin, "serve", "-addr", fmt.Sprintf("127.0.0.1:%d", port))
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "REDIS_URL=") && !strings.HasPrefix(kv, "LAB_") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logs := make(chan string, 256)
	go func() {
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			logs <- s.Text()
		}
		close(logs)
	}()
	var logged []string
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("logs:\n%s", strings.Join(logged, "\n"))
		}
	}()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHealthy(t, base)

	ready := labtest.Decode[struct {
		Dependencies map[string]struct{ Status, Describe string } `json:"dependencies"`
	}](t, labtest.Do(t, http.MethodGet, base+"/ready", nil, ""))
	pg, rd := ready.Dependencies["postgres"], ready.Dependencies["redis"]
	if pg.Status != "ok" || !strings.Contains(pg.Describe, "embedded throwaway cluster") || rd.Status != "ok" || !strings.Contains(rd.Describe, "embedded") {
		t.Fatalf("ready: %+v", ready)
	}
	for _, store := range []lab.StoreName{"memory", "redis", "postgres"} {
		r := labtest.Charge(t, base, store, labtest.Acme, "zero-config-"+string(store), `{"account":"acct-1","amount_cents":2500}`)
		if r.Status != http.StatusCreated {
			t.Fatalf("%s: %d %s", store, r.Status, r.Body)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if err := testsignal.Receive(t, "the lab stopping on SIGINT", done); err != nil {
		t.Fatalf("exit: %v", err)
	}
	for line := range logs {
		logged = append(logged, line)
	}
	// The start line says who may reset everything, and the pid that stops it.
	started := strings.Join(logged, "\n")
	if !strings.Contains(started, "anyone on this machine") || !strings.Contains(started, fmt.Sprintf(`stop="Ctrl-C, or kill %d"`, cmd.Process.Pid)) {
		t.Errorf("the start lines do not say who may reset every namespace, or how to stop this pid (%d)", cmd.Process.Pid)
	}
	// The cluster's directory and postmaster PID are in the logs.
	var dir string
	var pid int
	for _, line := range logged {
		if m := regexp.MustCompile(`started embedded PostgreSQL.*dir=(\S+) .*pid=(\d+)`).FindStringSubmatch(line); m != nil {
			dir = m[1]
			fmt.Sscan(m[2], &pid)
		}
	}
	if dir == "" || pid == 0 {
		t.Fatalf("no embedded cluster in the logs")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("cluster directory %s left behind (%v)", dir, err)
	}
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		t.Errorf("postmaster %d still alive (%v)", pid, err)
	}
}

// TestServeBeyondLoopbackDrawsAnAdminToken: bound to every interface with
// no -admin-token, the lab draws one and prints it once at start; an
// anonymous reset or restart of every namespace (all=true) is refused with
// a problem and deletes nothing, and the printed token does it.
func TestServeBeyondLoopbackDrawsAnAdminToken(t *testing.T) {
	t.Parallel()
	r, w := io.Pipe()
	ctx, stop := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() {
		served <- run(ctx, []string{"serve", "-addr", "0.0.0.0:0", "-admin-token=", "-database-url=", "-embedded-postgres", "off",
			"-redis-url=", "-redis-pair", "off", "-provider-url=", "-provider-addr", "127.0.0.1:0", "-peers="}, io.Discard, w)
		w.Close()
	}()
	var start strings.Builder
	scan := bufio.NewScanner(r)
	for scan.Scan() && !strings.Contains(scan.Text(), `msg="lab ready"`) {
		start.WriteString(scan.Text() + "\n")
	}
	go func() { _, _ = io.Copy(io.Discard, r) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("lab serve: %v", err)
		}
	})
	base := regexp.MustCompile(`url=(http://\S+)`).FindStringSubmatch(scan.Text())
	token := regexp.MustCompile(`(?m)^    (lab-admin-[A-Z2-7]{20,})$`).FindStringSubmatch(start.String())
	if base == nil || token == nil {
		t.Fatalf("no url in the ready line %q, or no admin token printed before it:\n%s", scan.Text(), start.String())
	}
	const key, body = "kept-beyond-loopback", `{"account":"acct-1","amount_cents":2500}`
	if c := labtest.Charge(t, base[1], "memory", labtest.Acme, key, body); c.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", c.Status, c.Body)
	}
	charges := func() int {
		return len(labtest.Get[struct{ Charges []string }](t, base[1]+"/charges?store=memory&key="+key, labtest.Acme).Charges)
	}
	for _, path := range []string{"/reset-lab?all=true", "/lab/restart-store?all=true&store=memory"} {
		labtest.WantProblem(t, "anonymous "+path, labtest.Do(t, http.MethodPost, base[1]+path, nil, ""), http.StatusUnauthorized, "admin_token_required", "")
	}
	if n := charges(); n != 1 {
		t.Fatalf("after the refused resets the ledger holds %d charge(s) under the key, want 1", n)
	}
	if again := labtest.Charge(t, base[1], "memory", labtest.Acme, key, body); again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the key was forgotten by a refused restart: %d %s", again.Status, again.Body)
	}
	if r := labtest.Do(t, http.MethodPost, base[1]+"/reset-lab?all=true", labtest.Bearer(token[1]), ""); r.Status != http.StatusOK {
		t.Fatalf("reset with the printed token: %d %s", r.Status, r.Body)
	}
	if n := charges(); n != 0 {
		t.Fatalf("after the admin's reset the ledger holds %d charge(s), want none", n)
	}
}
