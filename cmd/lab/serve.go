package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

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
	log.Info("lab ready", "url", a.URL())
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
