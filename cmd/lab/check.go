package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab/grade"
)

// errCheckFailed is lab check's answer for a target that failed a MUST
// case or the storm: a verdict, so the command exits 1.
var errCheckFailed = errors.New("the target failed the check")

// headerList is a repeatable flag of "Name: value" headers.
type headerList struct{ h http.Header }

func (l *headerList) String() string {
	if l == nil || l.h == nil {
		return ""
	}
	var parts []string
	for k, vs := range l.h {
		for _, v := range vs {
			parts = append(parts, k+": "+v)
		}
	}
	return strings.Join(parts, ", ")
}

func (l *headerList) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t") {
		return fmt.Errorf("a header is written Name: value (got %q)", v)
	}
	if l.h == nil {
		l.h = http.Header{}
	}
	l.h.Add(name, strings.TrimSpace(value))
	return nil
}

// runCheck is lab check: the black-box suite of package grade against any
// Idempotency-Key API, printed as a table, markdown or JSON.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c grade.Config
	var header, slow headerList
	fs.StringVar(&c.Target, "target", "", "the endpoint to check, query included, e.g. http://127.0.0.1:8616/charges?store=postgres (required)")
	fs.StringVar(&c.Method, "method", http.MethodPost, "the endpoint's method")
	fs.StringVar(&c.Token, "token", "", "bearer token of the first client (Authorization: Bearer …)")
	fs.StringVar(&c.Token2, "token2", "", "bearer token of a second client, for the case that holds keys per client")
	fs.StringVar(&c.Body, "body", `{"account":"acct-check","amount_cents":1234,"currency":"USD"}`, "the request body; {{key}} is replaced by the key, {{run}} by the check's run id")
	fs.StringVar(&c.OtherBody, "other-body", "", "another payload for the reused-key case; empty adds 1 to the body's first integer field")
	fs.StringVar(&c.IDPointer, "id", "/id", "JSON pointer of the resource id in a 2xx body")
	fs.StringVar(&c.OperationID, "operation-id", "/response/id", "JSON pointer of the resource id in an operation's answer (the Location of a 202)")
	fs.StringVar(&c.ReplayHeader, "replay-header", "Idempotent-Replayed", "header marking a replayed answer; empty for none")
	fs.DurationVar(&c.Retention, "retention", 0, fmt.Sprintf("the target's declared key retention; the case waits it out (at most %s); 0 skips it", grade.MaxRetention))
	fs.Var(&header, "header", "a header sent with every request, Name: value (repeatable), e.g. a custom auth header")
	fs.Var(&slow, "slow-header", "a header sent only with the first request of the in-flight case, to make the target slow (repeatable), e.g. 'Lab-Fault: slow;work_ms=300'")
	fs.StringVar(&c.ReadBack, "readback", "", "URL template on the target's host answering the resources created under a key, {key} for the key, e.g. http://host/charges?key={key}")
	fs.StringVar(&c.ReadBackIDs, "readback-ids", "", "JSON pointer of the array in the read-back's answer (empty: the answer is the array); elements are ids or resources with one at -id")
	keyForm := fs.String("key-form", string(grade.SFString), `how keys are written: sf (the draft's "…") or bare`)
	fs.IntVar(&c.Storm, "storm", grade.DefaultStorm, fmt.Sprintf("concurrent retries in the storm, 1..%d", grade.MaxStorm))
	fs.DurationVar(&c.Timeout, "timeout", 2*time.Minute, "bound on the whole check")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", 10*time.Second, "bound on one request")
	fs.IntVar(&c.MaxRequests, "max-requests", grade.DefaultRequests, "bound on the requests the check sends")
	only := fs.String("cases", "", "run only these cases, comma-separated (the history is always checked)")
	format := fs.String("format", "table", "table, markdown or json")
	historyOut := fs.String("history", "", "also write the history of every request sent to this file (NDJSON, for lab check-history -html)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: lab check -target URL [flags]\n\n"+
			"Checks an Idempotency-Key API over HTTP, case by case (docs/check.md); sends only to the target's host.\n"+
			"Exit 0 when no MUST case (a rule the draft says MUST) and not the storm (concurrent retries of one request)\nfailed, 1 when one did, 2 when the check could not run, 130 when Ctrl-C stopped it.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if c.Target == "" {
		fs.Usage()
		return errors.New("check needs -target")
	}
	switch *format {
	case "table", "markdown", "json":
	default:
		return fmt.Errorf("-format is table, markdown or json (got %q)", *format)
	}
	c.KeyForm, c.Header, c.SlowHeader = grade.KeyForm(*keyForm), header.h, slow.h
	if *only != "" {
		c.Only = strings.Split(*only, ",")
	}
	c.Progress = func(done, total int, r grade.Result) {
		fmt.Fprintf(stderr, "check: %d/%d %s: %s\n", done, total, r.ID, r.Verdict)
	}
	rep, err := grade.Run(ctx, c)
	if err != nil {
		return err
	}
	if *historyOut != "" {
		if err := writeHistory(*historyOut, rep); err != nil {
			return err
		}
	}
	switch *format {
	case "json":
		err = rep.WriteJSON(stdout)
	case "markdown":
		err = rep.WriteMarkdown(stdout)
	default:
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		return err
	}
	if !rep.Passed() {
		return fmt.Errorf("%w: %s", errCheckFailed, strings.Join(rep.Failed, ", "))
	}
	return nil
}

func writeHistory(path string, rep grade.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("error creating the history file: %w", err)
	}
	if err := rep.History.WriteNDJSON(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("error writing the history file: %w", err)
	}
	return nil
}
