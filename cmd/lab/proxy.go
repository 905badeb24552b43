package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/front"
	"github.com/idempotency-lab/lab/lab/httpserve"
)

// runProxy serves the round-robin front until ctx ends.
func runProxy(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", env("LAB_ADDR", "127.0.0.1:8616"), "listen address (env LAB_ADDR)")
	targets := fs.String("targets", env("LAB_PROXY_TARGETS", ""), "replica base URLs, comma-separated (env LAB_PROXY_TARGETS)")
	interval := fs.Duration("health-interval", time.Second, "how often each replica's /health is checked")
	level := fs.String("log-level", env("LAB_LOG_LEVEL", "info"), "debug, info, warn or error (env LAB_LOG_LEVEL)")
	// The lab's servers' timeouts, under the same names.
	d := app.DefaultConfig()
	if err := declare(fs, timeoutSettings(&d), os.LookupEnv); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(stderr, *level)
	if err != nil {
		return err
	}
	var urls []string
	for t := range strings.SplitSeq(*targets, ",") {
		if t = strings.TrimSuffix(strings.TrimSpace(t), "/"); t != "" {
			urls = append(urls, t)
		}
	}
	f, err := front.New(urls, *interval, log)
	if err != nil {
		return fmt.Errorf("%w (set -targets or LAB_PROXY_TARGETS)", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", *addr)
	if err != nil {
		return fmt.Errorf("error listening on %s: %w", *addr, err)
	}
	srv := httpserve.New(f.Handler(), d.Timeouts())
	checks, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f.Run(checks) })
	served := make(chan error, 1)
	go func() { served <- srv.Serve(httpserve.Listener(ln)) }()
	log.Info("front listening", "addr", ln.Addr().String(), "replicas", urls)
	select {
	case <-ctx.Done():
	case err = <-served:
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil && err == nil {
		err = serr
	}
	stop()
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// runHealth checks a URL answers 200: the container health check, where no
// curl is installed.
func runHealth(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	u := fs.String("url", healthURL(os.Getenv("LAB_ADDR"), os.Getenv("LAB_BASE_PATH")), "URL that must answer 200 (default from LAB_ADDR and LAB_BASE_PATH)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("unhealthy: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("unhealthy: %s answered %d", *u, resp.StatusCode)
	}
	return nil
}

// healthURL is the lab's /health on the address it listens on (LAB_ADDR),
// reached on loopback when it listens on every interface.
func healthURL(addr, basePath string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		host, port = "127.0.0.1", "8616"
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + strings.TrimSuffix(basePath, "/") + "/health"
}
