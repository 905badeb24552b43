package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/idempotency-lab/lab/lab/experiment"
)

// runMatrix runs the breakage matrix on a lab of its own (started with the
// same configuration as serve, on a free loopback port), or on a running
// lab with -url, and prints it; with -write, it rewrites README.md's copy.
func runMatrix(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	m := NewMain(stderr)
	fs, err := m.flags("lab matrix")
	if err != nil {
		return err
	}
	format := fs.String("format", "table", "table, markdown or json")
	remote := fs.String("url", "", "base URL of a running lab to run the matrix on (default: start one here)")
	write := fs.Bool("write", false, "with -format markdown, rewrite the table in "+readmeFile+" (between its matrix markers) instead of printing it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *format != "table" && *format != "markdown" && *format != "json" {
		return fmt.Errorf("-format must be table, markdown or json (got %q)", *format)
	}
	if *write && (*format != "markdown" || *remote != "") {
		return errors.New("-write rewrites the README's markdown table from a matrix run here: use -format markdown, without -url")
	}
	if *remote != "" {
		return remoteMatrix(ctx, strings.TrimSuffix(*remote, "/"), *format, stdout)
	}
	level := m.LogLevel
	if level == "info" {
		level = "warn" // the progress is the output here
	}
	bar := &progressLine{w: stderr, tty: isTerminal(stderr)}
	log, err := newLogger(bar, level) // log lines never land inside the bar
	if err != nil {
		return err
	}
	m.Config.Logger = log
	m.Config.FaultsEnabled = true
	a, stop, err := startOwnLab(ctx, m.Config)
	if err != nil {
		return err
	}
	defer stop()
	// The cells that do not run come first, at once: the bar counts runs.
	skipped := 0
	mx, err := a.Service().Matrix(ctx, a.Public(), func(done, total int, c experiment.Case, cell experiment.Cell) {
		if !cell.Available {
			skipped++
			return
		}
		bar.show(done-skipped, total-skipped, c.Name+" / "+string(cell.Store))
	})
	bar.end()
	if err != nil {
		return err
	}
	switch {
	case *write:
		return writeReadme(readmeFile, mx)
	case *format == "markdown":
		return mx.WriteMarkdown(stdout)
	case *format == "json":
		return mx.WriteJSON(stdout)
	}
	return mx.WriteTable(stdout)
}

// The README's copy of the matrix, which a test holds to what the lab
// produces, sits between these lines.
const (
	readmeFile  = "README.md"
	matrixBegin = "<!-- matrix:begin -->\n"
	matrixEnd   = "<!-- matrix:end -->"
)

// writeReadme rewrites the matrix in the README at path. The table is the
// lesson, so a cell that did not run, or whose verdict is not its design's
// usual one, is refused rather than written down.
func writeReadme(path string, mx experiment.Matrix) error {
	var bad []string
	for _, row := range mx.Rows {
		for _, c := range row.Cells {
			if !c.Available && !c.NotApplicable {
				bad = append(bad, fmt.Sprintf("%s/%s did not run here: %s", row.Case.Name, c.Store, c.HowToEnable))
			}
		}
	}
	bad = append(bad, mx.Disagreements()...)
	if bad = append(bad, mx.Mismatches()...); len(bad) > 0 {
		return fmt.Errorf("%s not rewritten: every cell that applies must run, reach its design's usual verdict and be proven so by its history and money:\n%s", path, strings.Join(bad, "\n"))
	}
	var table strings.Builder
	if err := mx.WriteMarkdown(&table); err != nil {
		return err
	}
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("error reading the README: %w", err)
	}
	out, err := spliceMatrix(string(doc), table.String())
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		return fmt.Errorf("error writing the README: %w", err)
	}
	return nil
}

// spliceMatrix puts table in place of what doc holds between the markers.
func spliceMatrix(doc, table string) (string, error) {
	head, rest, ok := strings.Cut(doc, matrixBegin)
	_, tail, ok2 := strings.Cut(rest, matrixEnd)
	if !ok || !ok2 {
		return "", fmt.Errorf("no matrix between %q and %q", strings.TrimSpace(matrixBegin), matrixEnd)
	}
	return head + matrixBegin + table + matrixEnd + tail, nil
}

// progressLine shows the matrix's progress: a bar redrawn in place on a
// terminal, one plain line per run otherwise. Log lines written through it
// start on a line of their own.
type progressLine struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	drawn bool // the bar is on the screen, without a newline after it
}

func (p *progressLine) show(done, total int, label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.tty {
		fmt.Fprintf(p.w, "matrix: %d/%d %s\n", done, total, label)
		return
	}
	const width = 30
	filled := done * width / total
	fmt.Fprintf(p.w, "\r[%s%s] %2d/%d %-40.40s", strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total, label)
	p.drawn = true
}

// Write writes a log line below the bar.
func (p *progressLine) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
	return p.w.Write(b)
}

// end leaves the bar's line.
func (p *progressLine) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func remoteMatrix(ctx context.Context, base, format string, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/lab/matrix?format="+format, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("error asking %s for the matrix: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var p struct{ Detail string }
		_ = json.NewDecoder(resp.Body).Decode(&p)
		return fmt.Errorf("%s answered %d: %s", base, resp.StatusCode, p.Detail)
	}
	_, err = io.Copy(stdout, resp.Body)
	return err
}
