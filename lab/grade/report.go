package grade

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// summary is the report's last line: what held, what failed, and whether
// the check passed.
func (r Report) summary() string {
	counts := map[Verdict]int{}
	for _, c := range r.Results {
		counts[c.Verdict]++
	}
	verdict := "PASSED: no MUST case (a rule the draft says MUST) failed, nor the storm (concurrent retries of one request: one resource)"
	if !r.Passed() {
		verdict = "FAILED: " + strings.Join(r.Failed, ", ")
	}
	return fmt.Sprintf("%d pass, %d fail, %d not applicable, %d could not verify; %d requests in %.1f s. %s",
		counts[Pass], counts[Fail], counts[NotApplicable], counts[Unverified], r.Requests, r.TookMS/1000, verdict)
}

// legend says in a few words what the table's own terms mean (the
// markdown's "what it asks" column says it of each case).
const legend = `draft-07: the IETF draft "The Idempotency-Key HTTP Header Field", version 07. MUST, SHOULD: its words for
a rule and a recommendation; lesson: what the lab adds. sf-string: the key as the draft writes it, a quoted
Structured Field string ("k"); bare-key: the same key unquoted; storm: many concurrent retries of one request.`

// WriteTable writes the report as aligned plain text.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "check of %s (run %s), against %s and the lab's lesson\n\n", r.Target, r.Run, Draft)
	fmt.Fprintln(tw, "case\tsource\tseverity\tverdict\twhy")
	for _, c := range r.Results {
		v := string(c.Verdict)
		if c.Verdict == Fail {
			v = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.ID, c.Source, c.Severity, v, c.Why)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("error writing the report: %w", err)
	}
	_, err := fmt.Fprintf(w, "\n%s\n%s\n", legend, r.summary())
	return err
}

// WriteMarkdown writes the report as a markdown table.
func (r Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Check of `%s` (run `%s`), against %s and the lab's lesson\n\n", r.Target, r.Run, Draft)
	b.WriteString("| case | what it asks | source | severity | verdict | why |\n|---|---|---|---|---|---|\n")
	cell := strings.NewReplacer("|", `\|`, "\n", " ")
	for _, c := range r.Results {
		v := string(c.Verdict)
		if c.Verdict == Fail {
			v = "**fail**"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", c.ID, cell.Replace(c.Title), c.Source, c.Severity, v, cell.Replace(c.Why))
	}
	fmt.Fprintf(&b, "\n%s\n", r.summary())
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report as one JSON document.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("error writing the report: %w", err)
	}
	return nil
}
