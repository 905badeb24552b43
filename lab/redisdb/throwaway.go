package redisdb

import (
	"context"
	"os/exec"
	"runtime"
)

// Throwaway is one redis-server process of our own on a free loopback
// port, without persistence: a real server for tests where none is
// configured. Close stops it and removes its directory.
type Throwaway struct {
	s *server
}

// StartThrowaway starts redis-server (see FindServer) and returns once it
// answers.
func StartThrowaway(ctx context.Context) (*Throwaway, error) {
	bin, err := FindServer()
	if err != nil {
		return nil, err
	}
	s, err := startServer(ctx, bin, "")
	if err != nil {
		return nil, err
	}
	return &Throwaway{s: s}, nil
}

// URL is the redis:// URL of the server.
func (t *Throwaway) URL() string { return "redis://" + t.s.addr + "/0" }

// PID is the server's process id.
func (t *Throwaway) PID() int { return t.s.cmd.Process.Pid }

// Close stops the server and removes its directory. It is idempotent.
func (t *Throwaway) Close() { t.s.stop() }

// spawn starts cmd and reaps it in the background; the channel is closed
// once it exited. Where the system allows, the server is killed when we
// die, so a crashed or timed-out process leaves no server behind.
func spawn(cmd *exec.Cmd) (<-chan struct{}, error) {
	cmd.SysProcAttr = dieWithParent()
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		// The parent-death signal fires when the forking thread exits,
		// not the process, so this thread lives until the child is reaped.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}
