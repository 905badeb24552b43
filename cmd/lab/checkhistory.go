package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/idempotency-lab/lab/lab/history"
)

// errNotLinearizable is check-history's answer for a history no single,
// atomic "charge once per key" explains: the command fails with it.
var errNotLinearizable = errors.New("the history is not linearizable")

// runCheckHistory checks a history recorded as NDJSON (a run's
// /lab/runs/{id}/history, or one written elsewhere in that format) and says
// whether one order of its operations explains every answer.
func runCheckHistory(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab check-history", flag.ContinueOnError)
	fs.SetOutput(stderr)
	htmlOut := fs.String("html", "", "also write the history's picture (porcupine's visualization) to this file")
	timeout := fs.Duration("timeout", 10*time.Second, "give up (verdict unknown) after this long")
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: lab check-history [-html FILE] [-timeout D] FILE (or - for standard input)\n\n"+
			"Checks a history in the NDJSON format of GET /lab/runs/{run_id}/history (docs/history.md):\n"+
			"exit 0 when linearizable, 1 on a violation or an unknown verdict, 2 when it cannot be read.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("check-history takes one file")
	}
	in := stdin
	if name := fs.Arg(0); name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("error opening the history: %w", err)
		}
		defer f.Close()
		in = f
	}
	h, err := history.ReadNDJSON(in)
	if err != nil {
		return fmt.Errorf("error reading the history: %w", err)
	}
	res := history.Check(h, *timeout)
	fmt.Fprintf(stdout, "%s: %d operations over %d keys, checked in %s\n", res.Verdict, res.Ops, len(h.Keys()), res.Took.Round(time.Microsecond))
	if res.Why != "" {
		fmt.Fprintln(stdout, res.Why)
	}
	if *htmlOut != "" {
		f, err := os.Create(*htmlOut)
		if err != nil {
			return fmt.Errorf("error creating the picture: %w", err)
		}
		if err := res.WriteHTML(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("error writing the picture: %w", err)
		}
	}
	if res.Verdict != history.Linearizable {
		return fmt.Errorf("%w (%s)", errNotLinearizable, res.Verdict)
	}
	return nil
}
