package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WriteJSON writes every figure of the load as indented JSON.
func (r *WorkshopResult) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("error writing the workshop load as JSON: %w", err)
	}
	return nil
}

// WriteTable writes the steps' and routes' latencies as aligned markdown,
// then the attendees, the matrix, the process and the checks. With
// markdown, the command that reproduces the load comes first and the
// notes are a list.
func (r *WorkshopResult) WriteTable(w io.Writer, markdown bool) error {
	var b strings.Builder
	if markdown && r.Command != "" {
		fmt.Fprintf(&b, "```sh\n%s\n```\n\n", r.Command)
	}
	length := fmt.Sprintf("%d rounds of the path each", r.Rounds)
	if r.Rounds == 0 {
		length = "rounds of the path for " + r.Duration.String()
	}
	fmt.Fprintf(&b, "%d attendees, %s, think time %s (seed %d); %d CPUs (GOMAXPROCS %d), %s; elapsed %s.\n\n",
		r.Attendees, length, millis(r.ThinkMS), r.Seed, r.Host.CPUs, r.Host.GOMAXPROCS, r.Host.Go, r.Elapsed.Round(100_000_000))
	right := []bool{false, true, true, true, true, true, true, false}
	grid(&b, latencyRows("step", r.Steps), right)
	grid(&b, latencyRows("route", r.Routes), right)
	bullet := ""
	if markdown {
		bullet = "- "
	}
	for _, n := range r.notes() {
		b.WriteString(bullet + n + "\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("error writing the workshop table: %w", err)
	}
	return nil
}

// String says what the load will do and how long it is expected to take.
func (p WorkshopPlan) String() string {
	first := "one attendee walks the path alone"
	if p.Matrices > 0 {
		first += " and fetches the matrix alone (as long as lab matrix takes)"
	}
	walk := fmt.Sprintf("%d round(s) of the path's %d steps each", p.Rounds, p.Steps)
	if p.Rounds == 0 {
		walk = fmt.Sprintf("rounds of the path's %d steps for %s each, finishing the round under way", p.Steps, p.Duration)
	}
	s := fmt.Sprintf("first %s; then %d attendees join within %s and walk %s, thinking %s on average (%s to %s) before each step: about %s each, plus the lab's answers",
		first, p.Attendees, p.Think, walk, p.Think, p.Think/2, p.Think*3/2, p.Thinking().Round(time.Second/10))
	if p.Matrices > 0 {
		s += fmt.Sprintf("; %d of them fetch the matrix again after their first round", p.Matrices)
	}
	return s + "."
}

func latencyRows(first string, stats []*StepStats) [][]string {
	rows := [][]string{{first, "answers", "p50", "p95", "p99", "max", "shed", "statuses"}}
	for _, st := range stats {
		rows = append(rows, []string{st.Name, strconv.Itoa(st.Count), millis(st.P50MS), millis(st.P95MS), millis(st.P99MS), millis(st.MaxMS), strconv.Itoa(st.Shed), statusText(st.Statuses)})
	}
	return rows
}

func statusText(sc map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(sc)) {
		parts = append(parts, fmt.Sprintf("%s×%d", k, sc[k]))
	}
	return strings.Join(parts, " ")
}

func (r *WorkshopResult) notes() []string {
	var out []string
	if len(r.WaitMS) > 0 {
		out = append(out, fmt.Sprintf("Attendees' time waiting on the lab (every request, refusals waited out included; thinking and the matrix not): median %s, slowest %s, fairness (slowest ÷ median) %.2f.",
			millis(median(r.WaitMS)), millis(slices.Max(r.WaitMS)), r.Fairness))
	}
	if r.MatrixAloneMS > 0 {
		loaded := "not fetched under load"
		if len(r.MatrixLoadedMS) > 0 {
			m := median(r.MatrixLoadedMS)
			loaded = fmt.Sprintf("under load %s (median of %d; %.2f× alone)", millis(m), len(r.MatrixLoadedMS), m/r.MatrixAloneMS)
		}
		out = append(out, fmt.Sprintf("The matrix alone %s, %s.", millis(r.MatrixAloneMS), loaded))
	}
	p := r.Process
	who := "the lab's process"
	if p.IncludesLoadGen {
		who = "the process (the lab and this load generator together)"
	}
	out = append(out, fmt.Sprintf("CPU of %s: %.1f s, %.2f cores on average, %.3f s per attendee; memory %.0f MiB before, %.0f MiB at most, %.2f MiB more per attendee.",
		who, p.CPUSeconds, p.CPUUtilisation, p.CPUPerAttendee, p.RSSBeforeBytes/(1<<20), p.RSSMaxBytes/(1<<20), p.RSSPerAttendee/(1<<20)))
	if r.PGOpen >= 0 {
		out = append(out, fmt.Sprintf("PostgreSQL connections: at most %d open, %d active.", r.PGOpen, r.PGActive))
	} else {
		out = append(out, "PostgreSQL connections: not measured (no DATABASE_URL to read pg_stat_activity from).")
	}
	shed := map[string]int{} // as the steps' statuses say it
	for _, st := range r.Steps {
		for k, n := range st.Statuses {
			if strings.HasPrefix(k, "shed ") {
				shed[k] += n
			}
		}
	}
	out = append(out, fmt.Sprintf("Shed (429 or 503 with Retry-After, waited out and retried): %d answers (%s); %d steps given up after %d in a row. Errors: %d answers 5xx without Retry-After; %d 429s without it.",
		r.Shed, cmp.Or(statusText(shed), "none"), r.GaveUp, maxRetries, r.FiveXX, r.Unannounced))
	verdicts := make([]string, 0, len(r.Alone))
	for _, k := range slices.Sorted(maps.Keys(r.Alone)) {
		verdicts = append(verdicts, fmt.Sprintf("%s %s", k, r.Alone[k]))
	}
	out = append(out, "Verdicts alone, every run under load held to them: "+strings.Join(verdicts, ", ")+".")
	if len(r.Wrong) == 0 {
		out = append(out, "Checks: every answer as expected, every run's verdict the same as alone, every ledger row the attendee's own.")
	} else {
		shown := r.Wrong[:min(len(r.Wrong), 10)]
		out = append(out, fmt.Sprintf("Checks: %d WRONG: %s", len(r.Wrong), strings.Join(shown, "; ")))
	}
	return out
}
