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
// removed on Close. It exists for the failover lesson: a write the primary
// acknowledged is lost when the replica is promoted before it replicated.
type Pair struct {
	servers [2]*server
	mu      sync.Mutex
	primary int // index of the current primary
	held    bool
}

type server struct {
	cmd  *exec.Cmd
	dir  string
	addr string
	done chan struct{}
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

func startServer(ctx context.Context, bin, replicaOf string) (*server, error) {
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
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("error starting redis-server: %w", err)
	}
	s := &server{cmd: cmd, dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := goredis.NewClient(&goredis.Options{Addr: s.addr})
		err := c.Ping(ctx).Err()
		_ = c.Close()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("redis-server on %s did not answer: %w", s.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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

// HoldReplication stops the replica from following the primary: it is
// pointed at a port nobody listens on, so from now on nothing the primary
// acknowledges reaches it, deterministically. The replica keeps what it
// already had.
func (p *Pair) HoldReplication(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held {
		return errors.New("replication is already held back")
	}
	nowhere, err := freePort()
	if err != nil {
		return err
	}
	if _, err := admin(ctx, p.servers[1-p.primary].addr, "REPLICAOF", "127.0.0.1", strconv.Itoa(nowhere)); err != nil {
		return err
	}
	p.held = true
	return nil
}

// Promote fails over: the replica becomes the primary with what it has,
// clients of the old primary are disconnected (they reconnect to the new
// one), and the old primary rejoins as the new one's replica, dropping
// what never replicated, as a failed-over primary does.
func (p *Pair) Promote(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	newer, older := p.servers[1-p.primary], p.servers[p.primary]
	if _, err := admin(ctx, newer.addr, "REPLICAOF", "NO", "ONE"); err != nil {
		return err
	}
	p.primary = 1 - p.primary
	p.held = false
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

// Held reports whether replication is held back.
func (p *Pair) Held() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
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
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	_ = os.RemoveAll(s.dir)
}

// Client returns a client that always dials the pair's current primary.
func (p *Pair) Client() *goredis.Client {
	return goredis.NewClient(&goredis.Options{
		Addr: "redis-pair", // a name only: the dialer picks the current primary
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, p.PrimaryAddr())
		},
	})
}
