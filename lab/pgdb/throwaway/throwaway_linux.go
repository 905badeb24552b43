//go:build linux

// Package throwaway starts a throwaway PostgreSQL cluster from locally
// installed server binaries, for running the lab without DATABASE_URL. It
// works on Linux; elsewhere Find and Start say so and the lab runs without
// the postgres store.
package throwaway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// superuser is the bootstrap role initdb creates.
	superuser = "postgres"
	// database is the database the lab uses.
	database = "lab"
	// readyTimeout bounds how long one server start may take to accept connections.
	readyTimeout = 30 * time.Second
	// portAttempts is how often a start is retried when another process took the port.
	portAttempts = 3
	// fastStopTimeout is how long Close waits for a fast shutdown before escalating.
	fastStopTimeout = 10 * time.Second
	// escalateTimeout is how long Close waits after each later escalation.
	escalateTimeout = 5 * time.Second
	// logTailBytes is how much of the server log errors quote.
	logTailBytes = 4096
)

// Find returns the directory holding initdb and postgres: PATH first, then
// /usr/lib/postgresql/*/bin (highest version). Symlinks are resolved, since
// initdb locates postgres next to its real path.
func Find() (string, error) {
	var tried []string
	if p, err := exec.LookPath("initdb"); err == nil {
		tried = append(tried, p)
		// A wrapper script would leave us without postgres beside it; only
		// accept a directory that really holds both binaries.
		if real, err := filepath.EvalSymlinks(p); err == nil {
			if dir := filepath.Dir(real); hasServerBinaries(dir) {
				return dir, nil
			}
		}
	}
	dirs, err := filepath.Glob("/usr/lib/postgresql/*/bin")
	if err != nil {
		return "", fmt.Errorf("error listing /usr/lib/postgresql: %w", err)
	}
	// Sort by numeric version so 10 beats 9.6.
	slices.SortFunc(dirs, func(a, b string) int {
		return slices.Compare(versionOf(b), versionOf(a))
	})
	for _, dir := range dirs {
		tried = append(tried, dir)
		if hasServerBinaries(dir) {
			return dir, nil
		}
	}
	if len(tried) == 0 {
		return "", errors.New("PostgreSQL server binaries not found: no initdb in PATH and no /usr/lib/postgresql/*/bin (install the postgresql server package)")
	}
	return "", fmt.Errorf("PostgreSQL server binaries not found: none of %s holds both initdb and postgres", strings.Join(tried, ", "))
}

func hasServerBinaries(dir string) bool {
	return isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres"))
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// versionOf extracts the numeric parts of /usr/lib/postgresql/<version>/bin.
func versionOf(binDir string) []int {
	var parts []int
	for _, s := range strings.Split(filepath.Base(filepath.Dir(binDir)), ".") {
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil
		}
		parts = append(parts, n)
	}
	return parts
}

// Cluster is a running throwaway PostgreSQL server. Close it to stop the
// server and delete its files.
type Cluster struct {
	logger *slog.Logger
	dir    string
	port   int
	pid    int
	srv    *server
	// settings are the caller's extra server settings, name=value.
	settings []string

	closeOnce sync.Once
	closeErr  error
}

// Start creates a cluster in a new temp directory, listening on a free
// loopback port with trust auth, database "lab" and superuser "postgres",
// and returns once it accepts connections. As root, the server runs as the
// user postgres (or nobody), because PostgreSQL refuses to run as root.
// Each of settings is a server setting, name=value, applied after the
// defaults, so it may override them (as max_connections=300).
func Start(ctx context.Context, logger *slog.Logger, settings ...string) (*Cluster, error) {
	c, binDir, cred, err := newCluster(logger, settings)
	if err != nil {
		return nil, err
	}
	if err := c.start(ctx, binDir, cred); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	logger.Info("started embedded PostgreSQL",
		"bin", binDir, "dir", c.dir, "port", c.port, "pid", c.pid)
	return c, nil
}

// newCluster makes the directory of a cluster not started yet, owned by
// the user the server will run as, and finds the binaries it runs.
func newCluster(logger *slog.Logger, settings []string) (*Cluster, string, *syscall.Credential, error) {
	binDir, err := Find()
	if err != nil {
		return nil, "", nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, "", nil, err
	}
	parent, err := tempParent(cred)
	if err != nil {
		return nil, "", nil, err
	}
	dir, err := os.MkdirTemp(parent, "lab-pg-*")
	if err != nil {
		return nil, "", nil, fmt.Errorf("error creating temp directory for PostgreSQL: %w", err)
	}
	c := &Cluster{logger: logger, dir: dir, settings: settings}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, "", nil, errors.Join(fmt.Errorf("error handing %s to the PostgreSQL user: %w", dir, err), c.Close())
		}
	}
	return c, binDir, cred, nil
}

func (c *Cluster) start(ctx context.Context, binDir string, cred *syscall.Credential) error {
	dataDir := filepath.Join(c.dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"),
		"-D", dataDir,
		"-U", superuser,
		"--auth=trust",
		"--encoding=UTF8",
		// C locale: the host may lack the locale named in its environment.
		"--locale=C",
		// The cluster is thrown away, so durability is pointless.
		"--no-sync",
	)
	if err := c.run(initdb, cred); err != nil {
		return fmt.Errorf("error running initdb: %w\n%s", err, c.logTail(0))
	}
	if err := c.serve(ctx, binDir, dataDir, cred); err != nil {
		return err
	}
	return c.createDatabase(ctx)
}

// serve starts the server on dataDir, on a free port (another, if one was
// taken meanwhile), and checks the server answering is the one started.
func (c *Cluster) serve(ctx context.Context, binDir, dataDir string, cred *syscall.Credential) error {
	for attempt := 1; ; attempt++ {
		err := c.startServer(ctx, binDir, dataDir, cred)
		if err == nil {
			break
		}
		if !errors.Is(err, errPortTaken) || attempt == portAttempts {
			return err
		}
		c.logger.Warn("embedded PostgreSQL port was taken, retrying", "attempt", attempt, "err", err)
	}
	pid, err := readPostmasterPID(dataDir)
	if err != nil {
		return err
	}
	// Proves the server we talk to is the one we started.
	if pid != c.srv.cmd.Process.Pid {
		return fmt.Errorf("error checking postmaster.pid: it names pid %d, but the started server is pid %d", pid, c.srv.cmd.Process.Pid)
	}
	c.pid = pid
	return nil
}

// errPortTaken marks a start that failed because the port was in use.
var errPortTaken = errors.New("port already in use")

// startServer runs postgres on a fresh port and waits until it is ready.
func (c *Cluster) startServer(ctx context.Context, binDir, dataDir string, cred *syscall.Credential) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	logStart := c.logSize()
	args := []string{
		"-D", dataDir,
		"-p", strconv.Itoa(port),
		"-k", c.dir,
		"-c", "listen_addresses=127.0.0.1",
		// Tests open several pools at once.
		"-c", "max_connections=200",
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
	}
	for _, s := range c.settings {
		args = append(args, "-c", s) // the last -c of a name wins
	}
	cmd := exec.Command(filepath.Join(binDir, "postgres"), args...)
	srv, err := c.spawn(cmd, cred)
	if err != nil {
		return fmt.Errorf("error starting postgres: %w", err)
	}
	c.srv = srv
	c.port = port

	readyCtx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	err = c.waitReady(readyCtx, dataDir)
	if err == nil {
		return nil
	}
	stopErr := c.stop()
	c.srv = nil
	tail := c.logTail(logStart)
	if !errors.Is(err, errPortTaken) &&
		(strings.Contains(tail, "Address already in use") || strings.Contains(tail, "could not create any TCP/IP sockets")) {
		err = fmt.Errorf("%w: %w", errPortTaken, err)
	}
	return errors.Join(fmt.Errorf("error waiting for postgres on port %d: %w\n%s", port, err, tail), stopErr)
}

// waitReady polls until the server accepts connections, it exits, or ctx ends.
func (c *Cluster) waitReady(ctx context.Context, dataDir string) error {
	var lastErr error
	for {
		select {
		case <-c.srv.done:
			return fmt.Errorf("postgres exited before accepting connections: %w", c.srv.err)
		default:
		}
		lastErr = c.ping(ctx, dataDir)
		if lastErr == nil || errors.Is(lastErr, errPortTaken) {
			return lastErr
		}
		select {
		case <-c.srv.done:
			return fmt.Errorf("postgres exited before accepting connections: %w", c.srv.err)
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ping connects once and checks the answering server uses our data
// directory, so a stranger on the port is not mistaken for ours.
func (c *Cluster) ping(ctx context.Context, dataDir string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.urlFor("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var got string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&got); err != nil {
		return err
	}
	if got != dataDir {
		return fmt.Errorf("%w: port %d is served from %s", errPortTaken, c.port, got)
	}
	return nil
}

func (c *Cluster) createDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.urlFor("postgres"))
	if err != nil {
		return fmt.Errorf("error connecting to embedded PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+database); err != nil {
		return fmt.Errorf("error creating database %s: %w", database, err)
	}
	return nil
}

// URL is a postgres:// URL for pgx to the "lab" database.
func (c *Cluster) URL() string {
	return c.urlFor(database)
}

func (c *Cluster) urlFor(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", superuser, c.port, db)
}

// Port is the loopback port the server listens on.
func (c *Cluster) Port() int { return c.port }

// PID is the postmaster's process id, as recorded in postmaster.pid.
func (c *Cluster) PID() int {
	return c.pid
}

// Close stops the server (fast shutdown, escalating to immediate and then
// SIGKILL) and removes the temp directory. It is idempotent.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		stopErr := c.stop()
		var rmErr error
		if err := os.RemoveAll(c.dir); err != nil {
			rmErr = fmt.Errorf("error removing %s: %w", c.dir, err)
		}
		c.closeErr = errors.Join(stopErr, rmErr)
		if c.closeErr == nil && c.pid != 0 {
			c.logger.Info("stopped embedded PostgreSQL", "dir", c.dir, "pid", c.pid)
		}
	})
	return c.closeErr
}

// stop shuts the current server down, if any, and waits until it has exited.
func (c *Cluster) stop() error {
	if c.srv == nil {
		return nil
	}
	steps := []struct {
		sig     syscall.Signal
		timeout time.Duration
	}{
		{syscall.SIGINT, fastStopTimeout},  // fast shutdown: abort sessions, checkpoint
		{syscall.SIGQUIT, escalateTimeout}, // immediate shutdown: no checkpoint
		{syscall.SIGKILL, escalateTimeout}, // backends exit once they see the postmaster gone
	}
	for _, s := range steps {
		// An error here means the process already exited; done will tell.
		_ = c.srv.cmd.Process.Signal(s.sig)
		select {
		case <-c.srv.done:
			return nil
		case <-time.After(s.timeout):
			c.logger.Warn("embedded PostgreSQL did not stop, escalating", "pid", c.srv.cmd.Process.Pid, "signal", s.sig.String())
		}
	}
	return fmt.Errorf("error stopping postgres: pid %d still running after SIGKILL", c.srv.cmd.Process.Pid)
}

// server is a postgres child process; err is valid once done is closed.
type server struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// spawn starts cmd and reaps it in the background. The child gets SIGQUIT
// (immediate shutdown) if we die, so a crash leaves no server behind.
func (c *Cluster) spawn(cmd *exec.Cmd, cred *syscall.Credential) (*server, error) {
	logFile, err := c.openLog()
	if err != nil {
		return nil, err
	}
	// The child holds its own copy of the descriptor.
	defer logFile.Close()
	c.prepare(cmd, cred, logFile)
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	// Own process group: a terminal's Ctrl-C reaches only us, and we stop
	// the server in order during Close.
	cmd.SysProcAttr.Setpgid = true

	srv := &server{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the forking thread exits, not the process,
		// so keep this thread alive until the child is reaped.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		srv.err = cmd.Wait()
		close(srv.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return srv, nil
}

// run runs a short-lived command to completion with output in the log.
func (c *Cluster) run(cmd *exec.Cmd, cred *syscall.Credential) error {
	logFile, err := c.openLog()
	if err != nil {
		return err
	}
	defer logFile.Close()
	c.prepare(cmd, cred, logFile)
	return cmd.Run()
}

func (c *Cluster) prepare(cmd *exec.Cmd, cred *syscall.Credential, logFile *os.File) {
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// The caller's working directory may be unreadable to the server user.
	cmd.Dir = c.dir
	cmd.Env = serverEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
}

// serverEnv drops PG* variables so the caller's settings cannot leak into
// the throwaway cluster.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

func (c *Cluster) logPath() string {
	return filepath.Join(c.dir, "postgres.log")
}

func (c *Cluster) openLog() (*os.File, error) {
	f, err := os.OpenFile(c.logPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("error opening PostgreSQL log: %w", err)
	}
	return f, nil
}

func (c *Cluster) logSize() int64 {
	fi, err := os.Stat(c.logPath())
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logTail returns the end of the log written after offset from, for errors.
func (c *Cluster) logTail(from int64) string {
	f, err := os.Open(c.logPath())
	if err != nil {
		return fmt.Sprintf("(no PostgreSQL log: %v)", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(error reading PostgreSQL log: %v)", err)
	}
	from = max(from, fi.Size()-logTailBytes)
	b, err := io.ReadAll(io.NewSectionReader(f, from, fi.Size()-from))
	if err != nil {
		return fmt.Sprintf("(error reading PostgreSQL log: %v)", err)
	}
	return "PostgreSQL log tail:\n" + strings.TrimSpace(string(b))
}

func readPostmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("error reading postmaster.pid: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("error parsing postmaster.pid: %w", err)
	}
	return pid, nil
}

// freePort asks the kernel for an unused loopback port. Another process may
// grab it before postgres binds; startServer retries in that case.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("error finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("error releasing port %d: %w", port, err)
	}
	return port, nil
}

// serverCredential returns the user to run PostgreSQL as, or nil to run as
// ourselves. PostgreSQL refuses to run as root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var u *user.User
	var err error
	for _, name := range []string{"postgres", "nobody"} {
		if u, err = user.Lookup(name); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("error finding an unprivileged user to run PostgreSQL (tried postgres, nobody): %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("error parsing uid of %s: %w", u.Username, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("error parsing gid of %s: %w", u.Username, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// tempParent picks where to create the cluster directory. When dropping
// privileges, the server user must be able to reach it, so a private TMPDIR
// falls back to /tmp.
func tempParent(cred *syscall.Credential) (string, error) {
	if cred == nil {
		return "", nil // os.MkdirTemp's default
	}
	dir := os.TempDir()
	for _, candidate := range []string{dir, "/tmp"} {
		if traversable(candidate, cred) {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("error choosing a temp directory: neither %s nor /tmp is reachable by uid %d", dir, cred.Uid)
}

// traversable reports whether every directory on path can be searched by
// cred, judged from permission bits (supplementary groups are ignored, as
// the server runs without them).
func traversable(path string, cred *syscall.Credential) bool {
	abs, err := filepath.Abs(path)
	if err != nil {
		return false
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil || !fi.IsDir() {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		perm := fi.Mode().Perm()
		var bit os.FileMode = 0o001
		switch {
		case st.Uid == cred.Uid:
			bit = 0o100
		case st.Gid == cred.Gid:
			bit = 0o010
		}
		if perm&bit == 0 {
			return false
		}
		if p == filepath.Dir(p) {
			return true
		}
	}
}
