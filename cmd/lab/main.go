// Command lab runs the idempotency lab.
//
//	lab [serve] [flags]   serve the lab (the default)
//	lab help              list the subcommands
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "lab:", err)
		}
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		m := NewMain(stderr)
		if err := m.ParseFlags(args); err != nil {
			return err
		}
		return m.Run(ctx)
	case "help":
		fmt.Fprintln(stdout, "usage: lab [serve] [flags]   (lab serve --help lists every flag and default)")
		return nil
	}
	return fmt.Errorf("unknown command %q (try: lab help)", cmd)
}

// shutdownGrace bounds how long in-flight requests may take to finish.
const shutdownGrace = 10 * time.Second

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("invalid log level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
