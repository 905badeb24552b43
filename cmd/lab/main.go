// Command lab runs the idempotency lab.
//
//	lab [serve] [flags]   serve the lab (the default)
//	lab matrix [flags]    run the breakage matrix and print it
//	lab proxy [flags]     round-robin front for a cluster of replicas
//	lab provider [flags]  the simulated payment provider, alone
//	lab bench [flags]     load every store's charge path and compare it with its ceilings
//	lab load [flags]      a workshop of simulated attendees on one lab, measured and checked
//	lab health [-url]     exit 0 when the URL answers 200 (container health check)
//	lab check-history F   check a recorded history for linearizability
//	lab check -target U   check any Idempotency-Key API over HTTP, case by case
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
		if ctx.Err() != nil { // Ctrl-C or SIGTERM cut it short: a requested stop, not a failure
			fmt.Fprintln(os.Stderr, "lab: stopped:", context.Cause(ctx))
			os.Exit(130)
		}
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "lab:", err)
		}
		if errors.Is(err, errNotLinearizable) || errors.Is(err, errCheckFailed) {
			os.Exit(1) // a verdict, not a failure to run
		}
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] != "" && args[0][0] != '-') {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		m := NewMain(stderr)
		if err := m.ParseFlags(args); err != nil {
			return err
		}
		return m.Run(ctx)
	case "matrix":
		return runMatrix(ctx, args, stdout, stderr)
	case "bench":
		return runBench(ctx, args, stdout, stderr)
	case "load":
		return runLoad(ctx, args, stdout, stderr)
	case "proxy":
		return runProxy(ctx, args, stderr)
	case "provider":
		return runProvider(ctx, args, stderr)
	case "health":
		return runHealth(ctx, args, stderr)
	case "check-history":
		return runCheckHistory(ctx, args, os.Stdin, stdout, stderr)
	case "check":
		return runCheck(ctx, args, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, commands)
		return nil
	}
	return fmt.Errorf("unknown command %q (try: lab help)", cmd)
}

const commands = `usage:
  lab [serve] [flags]   serve the lab (the default); lab serve --help lists every flag and default
  lab matrix [flags]    run every store against every scenario and print the table
                        (-format table|markdown|json; -url to use a running lab)
  lab bench [flags]     load every store's charge path over HTTP (fresh and replayed keys,
                        1 and 3 replicas), check the ledger, compare with pgbench,
                        redis-benchmark and a bare Echo handler (-smoke, -json, -markdown)
  lab load [flags]      a workshop on one lab: simulated attendees (-attendees 30), each joined,
                        walking the README's path with think time; per step and route p50/p95/p99,
                        fairness, the matrix under load, CPU, memory, PostgreSQL connections and
                        the checks (-smoke, -url, -json, -markdown)
  lab proxy [flags]     round-robin, health-checked front for several replicas
  lab provider [flags]  the simulated payment provider alone (captures, receipts,
                        faults, signed webhooks); point the lab at it with -provider-url
  lab health [-url U]   exit 0 when U answers 200 (container health check)
  lab check-history F   check a run's history (NDJSON, as /lab/runs/{id}/history answers it) for
                        linearizability; exit 1 when no single charge per key explains it (-html)
  lab check -target U   check any Idempotency-Key API over HTTP, case by case (the draft's MUSTs
                        and SHOULDs, the storm, lost responses, the history); exit 1 when a MUST
                        or the storm fails (-token, -token2, -slow-header, -readback, -format)
`

// shutdownGrace bounds how long in-flight requests may take to finish.
const shutdownGrace = 10 * time.Second

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("invalid log level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
