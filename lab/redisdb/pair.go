package redisdb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Pair is a Redis primary with an asynchronously replicating replica: two
// throwaway redis-server processes on loopback ports, without persistence,
// removed on Close, or two servers the lab is given (ConnectPair). It
// exists for the failover lesson: a write the primary acknowledged is lost
// when the replica is promoted before it replicated. Which server is the
// primary, and whether replication is held back, is read from the servers
// themselves, so several lab processes can share one pair.
type Pair struct {
	servers [2]*server
	mu      sync.Mutex
	primary int // index of the primary last seen
}

type server struct {
	cmd  *exec.Cmd // nil for a server the lab was given
	dir  string
	addr string
	done <-chan struct{}
}

// ConnectPair uses two running servers, one replicating the other (their
// redis:// URLs, in either order: the roles are read from the servers).
func ConnectPair(ctx context.Context, first, second string) (*Pair, error) {
	p := &Pair{}
	for i, u := range []string{first, second} {
		opts, err := goredis.ParseURL(u)
		if err != nil {
			return nil, fmt.Errorf("error parsing the Redis pair's URL %q: %w", u, err)
		}
		p.servers[i] = &server{addr: opts.Addr}
	}
	if _, err := p.locate(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// locate finds the server that says it is a primary, and remembers it.
func (p *Pair) locate(ctx context.Context) (int, error) {
	p.mu.Lock()
	last := p.primary
	p.mu.Unlock()
	for _, i := range []int{last, 1 - last} {
		role, err := admin(ctx, p.servers[i].addr, "ROLE")
		if err == nil && strings.HasPrefix(role, "[master") {
			p.mu.Lock()
			p.primary = i
			p.mu.Unlock()
			return i, nil
		}
	}
	return 0, fmt.Errorf("neither %s nor %s is a Redis primary", p.servers[0].addr, p.servers[1].addr)
}

// FindServer locates the redis-server binary.
func FindServer() (string, error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server is not installed (apt-get install redis-server): %w", err)
	}
	return path, nil
}

// StartPair starts a primary and a replica following it, and waits until
// the replica's link is up.
func StartPair(ctx context.Context) (*Pair, error) {
	bin, err := FindServer()
	if err != nil {
		return nil, err
	}
	p := &Pair{}
	for i := range p.servers {
		replicaOf := ""
		if i == 1 {
			replicaOf = p.servers[0].addr
		}
		s, err := startServer(ctx, bin, replicaOf)
		if err != nil {
			p.Close()
			return nil, err
		}
		p.servers[i] = s
	}
	if err := p.waitLinked(ctx, p.servers[1].addr); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// startServer runs one redis-server on a free loopback port and returns
// once it answers; another process taking the port first is retried.
func startServer(ctx context.Context, bin, replicaOf string) (*server, error) {
	for attempt := 1; ; attempt++ {
		s, err := tryServer(ctx, bin, replicaOf)
		if !errors.Is(err, errPortTaken) || attempt == portAttempts {
			return s, err
		}
	}
}

// portAttempts is how often a start is tried when another process took the port.
const portAttempts = 3

// errPortTaken marks a start that lost its port to another process.
var errPortTaken = errors.New("the port was taken")

func tryServer(ctx context.Context, bin, replicaOf string) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "lab-redis-")
	if err != nil {
		return nil, fmt.Errorf("error creating a directory for redis-server: %w", err)
	}
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no", "--loglevel", "warning",
		"--repl-diskless-sync-delay", "0"} // a replica syncs at once, not after the default 5 s
	if replicaOf != "" {
		host, rport, _ := net.SplitHostPort(replicaOf)
		args = append(args, "--replicaof", host, rport)
	}
	cmd := exec.Command(bin, args...) // outlives ctx: stopped by Close
	done, err := spawn(cmd)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("error starting redis-server: %w", err)
	}
	s := &server{cmd: cmd, dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), done: done}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.ours(ctx)
		if err == nil {
			return s, nil
		}
		if errors.Is(err, errPortTaken) || time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s did not answer: %w", s.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ours checks the server answering on s's port is the process s started,
// so a stranger that took the port first is not mistaken for it.
func (s *server) ours(ctx context.Context) error {
	select {
	case <-s.done:
		return fmt.Errorf("redis-server exited before answering (%w?)", errPortTaken)
	default:
	}
	info, err := admin(ctx, s.addr, "INFO", "server")
	if err != nil {
		return err
	}
	pid := "process_id:" + strconv.Itoa(s.cmd.Process.Pid)
	for line := range strings.Lines(info) {
		if strings.TrimSpace(line) == pid {
			return nil
		}
	}
	return fmt.Errorf("%w: another server answers on %s", errPortTaken, s.addr)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("error finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// admin runs one command on a server over a connection of its own.
func admin(ctx context.Context, addr string, args ...any) (string, error) {
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	v, err := c.Do(ctx, args...).Result()
	if err != nil {
		return "", fmt.Errorf("error running %v on %s: %w", args[0], addr, err)
	}
	return fmt.Sprint(v), nil
}

// waitLinked waits until the replica at addr reports its link to its
// primary up and in sync.
func (p *Pair) waitLinked(ctx context.Context, addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := admin(ctx, addr, "INFO", "replication")
		if err == nil && strings.Contains(info, "master_link_status:up") && !strings.Contains(info, "master_sync_in_progress:1") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the replica at %s never linked to its primary (%v)", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PrimaryAddr is the current primary's address.
func (p *Pair) PrimaryAddr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.servers[p.primary].addr
}

// ReplicaAddr is the current replica's address.
func (p *Pair) ReplicaAddr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.servers[1-p.primary].addr
}

// ErrHeld is a hold asked while replication is already held back.
var ErrHeld = errors.New("replication is already held back")

// Held reports whether the replica follows someone other than the primary:
// replication is held back (a failover is under way).
func (p *Pair) Held(ctx context.Context) (bool, error) {
	primary, err := p.locate(ctx)
	if err != nil {
		return false, err
	}
	info, err := admin(ctx, p.servers[1-primary].addr, "INFO", "replication")
	if err != nil {
		return false, err
	}
	// The hold points the replica at another port; a replica reached
	// through a name may know its primary by name, so the port decides.
	_, port, _ := net.SplitHostPort(p.servers[primary].addr)
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "master_port:"); ok {
			return v != port, nil
		}
	}
	return true, nil // no primary at all: not following this one
}

// HoldReplication stops the replica from following the primary: it is
// pointed at a port nobody listens on, so from now on nothing the primary
// acknowledges reaches it, deterministically. The replica keeps what it
// already had.
func (p *Pair) HoldReplication(ctx context.Context) error {
	held, err := p.Held(ctx)
	switch {
	case err != nil:
		return err
	case held:
		return ErrHeld
	}
	nowhere, err := freePort()
	if err != nil {
		return err
	}
	_, err = admin(ctx, p.ReplicaAddr(), "REPLICAOF", "127.0.0.1", strconv.Itoa(nowhere))
	return err
}

// Promote fails over: the replica becomes the primary with what it has,
// clients of the old primary are disconnected (they reconnect to the new
// one), and the old primary rejoins as the new one's replica, dropping
// what never replicated, as a failed-over primary does.
func (p *Pair) Promote(ctx context.Context) error {
	primary, err := p.locate(ctx)
	if err != nil {
		return err
	}
	newer, older := p.servers[1-primary], p.servers[primary]
	if _, err := admin(ctx, newer.addr, "REPLICAOF", "NO", "ONE"); err != nil {
		return err
	}
	p.mu.Lock()
	p.primary = 1 - primary
	p.mu.Unlock()
	host, port, _ := net.SplitHostPort(newer.addr)
	if _, err := admin(ctx, older.addr, "REPLICAOF", host, port); err != nil {
		return err
	}
	// Connections still open to the old primary would write to a replica.
	if _, err := admin(ctx, older.addr, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"); err != nil {
		return err
	}
	return p.waitLinked(ctx, older.addr)
}

// Close stops both servers and removes their directories.
func (p *Pair) Close() {
	for _, s := range p.servers {
		if s != nil {
			s.stop()
		}
	}
}

func (s *server) stop() {
	if s.cmd == nil {
		return // not ours to stop
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	_ = os.RemoveAll(s.dir)
}

// Client returns a client that always dials the pair's current primary:
// each new connection asks the servers which one it is, so a client of a
// lab process that did not fail the pair over follows it too.
func (p *Pair) Client() *goredis.Client {
	return goredis.NewClient(&goredis.Options{
		Addr: "redis-pair", // a name only: the dialer picks the current primary
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			i, err := p.locate(ctx)
			if err != nil {
				return nil, err
			}
			var d net.Dialer
			return d.DialContext(ctx, network, p.servers[i].addr)
		},
	})
}
