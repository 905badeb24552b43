package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/variants"
)

// Main is the composition root: the one place that knows every variant
// (variants.Builtin), reads the configuration and runs the lab. Tests build
// their labs from NewMain too.
type Main struct {
	Config   app.Config
	LogLevel string
	stderr   io.Writer
}

// NewMain returns a Main with the lab's defaults and every built-in
// variant, writing logs to stderr.
func NewMain(stderr io.Writer) *Main {
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	return &Main{Config: cfg, LogLevel: "info", stderr: stderr}
}

// ParseFlags reads flags, with environment variables as their defaults.
func (m *Main) ParseFlags(args []string) error {
	fs, err := m.flags("lab serve")
	if err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return nil
}

// flags declares the lab's configuration on a new flag set, with the
// environment already applied.
func (m *Main) flags(name string) (*flag.FlagSet, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(m.stderr)
	ss := settings(&m.Config, &m.LogLevel)
	if err := declare(fs, ss, os.LookupEnv); err != nil {
		return nil, err
	}
	fs.Usage = func() { usage(fs.Output(), name, fs, ss) }
	return fs, nil
}

// Run serves until ctx is cancelled, then shuts down gracefully.
func (m *Main) Run(ctx context.Context) error {
	log, err := newLogger(m.stderr, m.LogLevel)
	if err != nil {
		return err
	}
	m.Config.Logger = log
	a, err := app.Start(ctx, m.Config)
	if err != nil {
		return err
	}
	switch token, drawn := a.AdminToken(); {
	case drawn: // printed once, in the clear, for whoever started it; never logged again
		fmt.Fprintf(m.stderr, "\nListening beyond this machine with no -admin-token: this run's admin token is\n\n    %s\n\n"+
			"Resetting or restarting every namespace (all=true) and seeing them all need it, as Authorization: Bearer.\n"+
			"Set -admin-token (LAB_ADMIN_TOKEN) to choose your own.\n\n", token)
	case token == "":
		log.Info("who may reset every namespace: anyone on this machine (listening on loopback, no -admin-token)")
	default:
		log.Info("who may reset every namespace: whoever sends the admin token (-admin-token)")
	}
	pid := strconv.Itoa(os.Getpid())
	log.Info("lab ready", "url", a.URL(), "pid", pid, "stop", "Ctrl-C, or kill "+pid)
	select {
	case <-ctx.Done():
	case err = <-a.Served():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if cerr := a.Close(sctx); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

// env returns the environment variable or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

// startOwnLab starts a lab of the command's own on a free loopback port, and
// the function that closes it, within shutdownGrace, when the command ends.
func startOwnLab(ctx context.Context, cfg app.Config) (*app.App, func(), error) {
	cfg.Addr = "127.0.0.1:0"
	a, err := app.Start(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return a, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
		defer cancel()
		_ = a.Close(sctx)
	}, nil
}
