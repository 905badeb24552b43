package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/cost"
)

// Pairing is a phase set beside one ceiling.
type Pairing struct {
	Name   string  `json:"name"`
	PerSec float64 `json:"per_s,omitempty"`
	Ratio  float64 `json:"ratio,omitempty"` // the phase's throughput over the ceiling's
	// Goal is the least ratio the issue asks of this pair, when it asks one.
	Goal float64 `json:"goal,omitempty"`
	// Status says why there is no figure.
	Status string `json:"status,omitempty"`
	// A serial bound's parts: the HTTP ceiling and the store's, whose
	// bound PerSec is (see serialBound).
	HTTPPerSec  float64 `json:"http_per_s,omitempty"`
	StorePerSec float64 `json:"store_per_s,omitempty"`
	// Over the rounds (a path's pairings): the spreads of the figure
	// beside the path and of the ratio.
	Rates  *Spread `json:"per_s_spread,omitempty"`
	Ratios *Spread `json:"ratio_spread,omitempty"`
}

// The targets: the least ratio each pair should reach.
const (
	redisReplayGoal      = 0.6  // redis replay over memory replay
	memoryReplayGoal     = 0.9  // memory replay over the bare Echo handler
	pgReplayBoundGoal    = 0.8  // postgres replay over its serial bound
	pgFreshBoundGoal     = 0.85 // postgres fresh (1,000 accounts) over its serial bound
	redisReplayBoundGoal = 0.85 // redis replay over its serial bound
)

// serialBound is the most a path can answer per second when each request
// passes through two parts one after the other, each at its own ceiling:
// a request costs the sum of their times, 1/http + 1/store. 0 when either
// is unknown.
func serialBound(http, store float64) float64 {
	if http <= 0 || store <= 0 {
		return 0
	}
	return 1 / (1/http + 1/store)
}

// pair sets each phase beside what bounds it: the postgres paths beside
// pgbench on the same statements (replays also beside a bare primary-key
// read), redis replays beside memory replays and redis-benchmark, memory
// replays beside a bare Echo handler, and every path on several replicas
// beside the same path on one. The postgres paths and the redis replay
// are also set beside their serial bound: the bare Echo handler and their
// store's ceiling one after the other. A phase meets only what its own
// round measured.
func pair(res *Result) {
	type roundID struct {
		round int
		id    string
	}
	byRound := map[roundID]*Ceiling{}
	for _, c := range res.Ceilings {
		byRound[roundID{c.Round, c.ID}] = c
	}
	for _, p := range res.Phases {
		find := func(store lab.StoreName, k Kind, replicas int) *Phase {
			for _, q := range res.Phases {
				if q.Store == store && q.Kind == k && q.Replicas == replicas && q.Round == p.Round {
					return q
				}
			}
			return nil
		}
		ceilings := func(id string) *Ceiling { return byRound[roundID{p.Round, id}] }
		var ps []Pairing
		add := func(id string, goal float64) {
			c := ceilings(id)
			switch {
			case c == nil:
			case c.Status != Measured:
				ps = append(ps, Pairing{Name: c.Name, Goal: goal, Status: c.Status})
			default:
				ps = append(ps, Pairing{Name: c.Name, PerSec: c.PerSec, Ratio: ratio(p.Throughput, c.PerSec), Goal: goal})
			}
		}
		// bound sets the phase beside the serial bound of the HTTP ceiling
		// and the store ceiling id, when the store's was measured (its own
		// row says why not).
		bound := func(id string, goal float64) {
			h, s := ceilings(EchoBare), ceilings(id)
			if h == nil || s == nil || s.Status != Measured {
				return
			}
			q := Pairing{Name: "serial bound: " + h.Name + " + " + s.Name, Goal: goal}
			switch {
			case h.Status != Measured:
				q.Status = h.Name + ": " + h.Status
			default:
				q.HTTPPerSec, q.StorePerSec = h.PerSec, s.PerSec
				q.PerSec = serialBound(h.PerSec, s.PerSec)
				q.Ratio = ratio(p.Throughput, q.PerSec)
			}
			ps = append(ps, q)
		}
		beside := func(q *Phase, name string, goal float64) {
			switch {
			case q == nil:
				ps = append(ps, Pairing{Name: name, Goal: goal, Status: "not loaded in this bench"})
			case q.Error != "":
				ps = append(ps, Pairing{Name: name, Goal: goal, Status: "could not run"})
			default:
				ps = append(ps, Pairing{Name: name, PerSec: q.Throughput, Ratio: ratio(p.Throughput, q.Throughput), Goal: goal})
			}
		}
		switch {
		case p.Replicas > 1:
			one := Phase{Store: p.Store, Kind: p.Kind, Replicas: 1}
			beside(find(p.Store, p.Kind, 1), one.Path(), 0)
		case p.Store == "postgres" && p.Kind == FreshHot:
			add(PgFreshHot, 0)
			bound(PgFreshHot, 0)
		case p.Store == "postgres" && p.Kind == FreshMany:
			add(PgFreshMany, 0)
			bound(PgFreshMany, pgFreshBoundGoal)
		case p.Store == "postgres" && p.Kind == Replay:
			add(PgSelect, 0)
			add(PgReplay, 0)
			bound(PgReplay, pgReplayBoundGoal) // the store's own statement
		case p.Store == "redis" && p.Kind == Replay:
			beside(find("memory", Replay, 1), "memory replay, 1 replica", redisReplayGoal)
			add(RedisSetNX, 0)
			add(RedisGet, 0)
			bound(RedisSetNX, redisReplayBoundGoal) // the store's own command
		case p.Store == "memory" && p.Kind == Replay:
			add(EchoBare, memoryReplayGoal)
		}
		p.Ceilings = ps
	}
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// thousands writes n with comma separators: 12,345.
func thousands(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func perSec(x float64) string {
	if x <= 0 {
		return "—"
	}
	if x < 10 {
		return strconv.FormatFloat(x, 'f', 1, 64)
	}
	return thousands(int(math.Round(x)))
}

func millis(x float64) string {
	switch {
	case x <= 0:
		return "—"
	case x < 10:
		return strconv.FormatFloat(x, 'f', 2, 64) + " ms"
	case x < 100:
		return strconv.FormatFloat(x, 'f', 1, 64) + " ms"
	}
	return thousands(int(math.Round(x))) + " ms"
}

func (p Pairing) ratioText() string {
	if p.Status != "" || p.Ratio <= 0 {
		return "—"
	}
	s := strconv.FormatFloat(p.Ratio, 'f', 2, 64) + "×"
	if p.Ratios != nil && p.Ratios.N > 1 {
		s += " (" + strconv.FormatFloat(p.Ratios.Min, 'f', 2, 64) + "–" + strconv.FormatFloat(p.Ratios.Max, 'f', 2, 64) + ")"
	}
	if p.Goal > 0 {
		verdict := "meets"
		if p.Ratio < p.Goal {
			verdict = "below"
		}
		s += fmt.Sprintf(" (%s goal ≥ %s×)", verdict, strconv.FormatFloat(p.Goal, 'f', -1, 64))
	}
	return s
}

// marks flags a path in the table: (!) some answers were not 2xx or a
// phase could not run; (ledger) a ledger check failed.
func (s *PathSummary) marks() string {
	var bad, ledger bool
	for _, p := range s.phases {
		bad = bad || p.Error != "" || p.Non2xx > 0
		ledger = ledger || p.Check != nil && !p.Check.OK
	}
	var m []string
	if bad {
		m = append(m, "(!)")
	}
	if ledger {
		m = append(m, "(ledger)")
	}
	return strings.Join(m, " ")
}

// rows lays the result out as the table's cells: one path a row (and a
// row more per extra ceiling), its medians over the rounds, and with
// several rounds the throughput's range.
func (r *Result) rows() [][]string {
	rounds := r.Repeat > 1
	head := []string{"path", "throughput /s", "p50", "p99", "ceiling", "ceiling /s", "ratio"}
	if rounds {
		head = slices.Insert(head, 2, "range /s")
	}
	out := [][]string{head}
	for _, s := range r.Paths {
		path := s.Path()
		if m := s.marks(); m != "" {
			path += " " + m
		}
		first := []string{path, perSec(s.Throughput.Median), millis(s.P50.Median), millis(s.P99.Median)}
		if s.Rounds == 0 {
			first[1], first[2], first[3] = "could not run", "", ""
		}
		if rounds {
			first = slices.Insert(first, 2, spreadText(s.Throughput))
		}
		blank := make([]string, len(first))
		for i, c := range s.Ceilings {
			cells := append(slices.Clone(blank), c.Name, perSec(c.PerSec), c.ratioText())
			if c.Status != "" {
				cells[len(cells)-2] = c.Status
			}
			if i == 0 {
				copy(cells, first)
			}
			out = append(out, cells)
		}
		if len(s.Ceilings) == 0 {
			out = append(out, append(first, "—", "", ""))
		}
	}
	return out
}

// spreadText is a spread's range, as the table shows it.
func spreadText(s Spread) string {
	if s.N < 2 {
		return "—"
	}
	return perSec(s.Min) + "–" + perSec(s.Max)
}

// ordered lists the phases store by store (in the lab's order), each
// store's paths together, one replica before several.
func (r *Result) ordered() []*Phase {
	kinds := []Kind{FreshHot, FreshMany, Replay}
	ps := slices.Clone(r.Phases)
	slices.SortStableFunc(ps, func(a, b *Phase) int {
		if c := slices.Index(r.Stores, a.Store) - slices.Index(r.Stores, b.Store); c != 0 {
			return c
		}
		if c := slices.Index(kinds, a.Kind) - slices.Index(kinds, b.Kind); c != 0 {
			return c
		}
		return a.Replicas - b.Replicas
	})
	return ps
}

// WriteTable writes the table, aligned and valid markdown, then the notes:
// marked phases, the ledger, skipped stores, every ceiling, the
// 64-attempt runs. With markdown, the command that reproduces the bench
// comes first and the notes are a list.
func (r *Result) WriteTable(w io.Writer, markdown bool) error {
	var b strings.Builder
	if markdown && r.Command != "" {
		fmt.Fprintf(&b, "```sh\n%s\n```\n\n", r.Command)
	}
	fmt.Fprintf(&b, "Phases of %s at %d connections (vegeta, unpaced), each once the outbox had drained; %d CPUs (GOMAXPROCS %d), %s, %s; elapsed %s.\n\n",
		r.Duration, r.Connections, r.Host.CPUs, r.Host.GOMAXPROCS, r.Host.Go, r.Host.OS, r.Elapsed.Round(100_000_000))
	if r.Repeat > 1 {
		fmt.Fprintf(&b, "%d rounds, one after the other (every path, ceiling and 64-attempt run once a round): each figure is the median of the rounds, the range its least and greatest, a ratio the median of the rounds' own ratios (its range in brackets).\n\n", r.Repeat)
	}
	right := []bool{false, true, true, true, false, true, false}
	if r.Repeat > 1 {
		right = slices.Insert(right, 2, true)
	}
	grid(&b, r.rows(), right)
	if rows := r.sustainedRows(); len(rows) > 1 {
		fmt.Fprintf(&b, "Sustained: fresh charges on %s accounts at fixed rates (vegeta's pacer) for %s each, the outbox relay running; the outbox sampled every %s.\n\n", thousands(Accounts), r.Duration, lagEvery)
		grid(&b, rows, []bool{false, true, true, true, true, true, true, true, true, true})
	}
	if rows := r.costRows(); len(rows) > 1 {
		b.WriteString("Cost of one operation, counted at the drivers (/metrics: lab_sql_*, lab_redis_round_trips_total, lab_http_requests_total), the first round's phases on 1 replica; commits durable + asynchronous, the lab's and its provider's:\n\n")
		grid(&b, rows, []bool{false, true, true, true, true, false})
	}
	bullet := ""
	if markdown {
		bullet = "- "
	}
	for _, n := range r.notes() {
		b.WriteString(bullet + n + "\n")
	}
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("error writing the bench table: %w", err)
	}
	return nil
}

// grid writes rows as an aligned markdown table, then a blank line; right
// says which columns align right.
func grid(b *strings.Builder, rows [][]string, right []bool) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(c), 3)
		}
	}
	line := func(cells []string) {
		b.WriteString("|")
		for i, c := range cells {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if right[i] {
				b.WriteString(" " + pad + c + " |")
			} else {
				b.WriteString(" " + c + pad + " |")
			}
		}
		b.WriteString("\n")
	}
	line(rows[0])
	b.WriteString("|")
	for i, wd := range widths {
		if right[i] {
			b.WriteString(strings.Repeat("-", wd+1) + ":|")
		} else {
			b.WriteString(strings.Repeat("-", wd+2) + "|")
		}
	}
	b.WriteString("\n")
	for _, row := range rows[1:] {
		line(row)
	}
	b.WriteString("\n")
}

// sustainedRows lays the sustained phases out as a table's cells: a step
// a row.
func (r *Result) sustainedRows() [][]string {
	out := [][]string{{"sustained", "offered /s", "charges /s", "delivered /s", "settled /s", "lag p50", "lag p99", "lag max", "backlog", "drain"}}
	for _, s := range r.Sustained {
		for _, x := range s.Steps {
			name := fmt.Sprintf("%s at %s of %s/s", s.Store, percent(x.Fraction), perSec(s.BasePerSec))
			if x.Search {
				name += " (search)"
			}
			var m []string
			if x.Error != "" || x.Non2xx > 0 {
				m = append(m, "(!)")
			}
			if x.Check != nil && !x.Check.OK {
				m = append(m, "(ledger)")
			}
			if len(m) > 0 {
				name += " " + strings.Join(m, " ")
			}
			out = append(out, []string{name, perSec(x.OfferedPerSec), perSec(x.Throughput), perSec(x.DeliveredPerSec), perSec(x.SettledPerSec),
				lagText(x.Lag.P50, x.Lag.Samples), lagText(x.Lag.P99, x.Lag.Samples), lagText(x.Lag.Max, x.Lag.Samples), thousands(x.BacklogAtEnd), millis(x.DrainMS)})
		}
	}
	return out
}

// sampling is how long the steps' outbox reads took and how far apart
// their samples came, medians over every step: a slow read spaces the
// samples out, and loads the books while the charges run.
func sampling(steps []*SustainedStep) (readMS, gapMS float64) {
	var reads, gaps []float64
	for _, x := range steps {
		for i, smp := range x.Samples {
			reads = append(reads, smp.OutboxMS)
			if i > 0 {
				gaps = append(gaps, smp.AtMS-x.Samples[i-1].AtMS)
			}
		}
	}
	return median(reads), median(gaps)
}

// lowestLaggedAbove is the step with the lowest offered rate above
// offered whose lag p99 reached MaxLag, nil when none did.
func lowestLaggedAbove(steps []*SustainedStep, offered float64) *SustainedStep {
	var low *SustainedStep
	for _, x := range steps {
		if x.lagged() && x.OfferedPerSec > offered && (low == nil || x.OfferedPerSec < low.OfferedPerSec) {
			low = x
		}
	}
	return low
}

// lagText writes a sampled lag: "0 ms" is a lag, "—" no sample.
func lagText(ms float64, samples int) string {
	switch {
	case samples == 0:
		return "—"
	case ms <= 0:
		return "0 ms"
	}
	return millis(ms)
}

// sustainedNotes say what each store sustained, and how its steps held
// to the ledger.
func (r *Result) sustainedNotes() []string {
	var out []string
	checked, held := 0, 0
	searched := false
	for _, s := range r.Sustained {
		for _, x := range s.Steps {
			searched = searched || x.Search
		}
		if s.Error != "" {
			out = append(out, fmt.Sprintf("sustained %s: skipped: %s", s.Store, s.Error))
			continue
		}
		line := fmt.Sprintf("sustained %s (fresh %s/s on %s", s.Store, perSec(s.BasePerSec), plural(s.Replicas, "replica"))
		if s.DrainPerSec > 0 {
			line += fmt.Sprintf(", its relay's drain to settlement %s/s", perSec(s.DrainPerSec))
		}
		line += "): "
		if s.SustainablePerSec > 0 {
			line += fmt.Sprintf("sustainable throughput %s/s, the %s step (offered %s/s), the highest whose lag p99 stayed under %s", perSec(s.SustainablePerSec), percent(s.SustainableFraction), perSec(s.SustainableOffered), MaxLag)
			if lagged := lowestLaggedAbove(s.Steps, s.SustainableOffered); lagged != nil {
				line += fmt.Sprintf(" (at %s/s it reached %s)", perSec(lagged.OfferedPerSec), lagText(lagged.Lag.P99, lagged.Lag.Samples))
			}
		} else {
			line += fmt.Sprintf("no step kept its lag p99 under %s (and its ledger check): no sustainable throughput found", MaxLag)
		}
		if s.BoundPerSec > 0 {
			line += fmt.Sprintf("; charges and their effects share the machine: at the rates each reached alone, together 1/(1/%s + 1/%s) = %s/s (%s of fresh)",
				perSec(s.BasePerSec), perSec(s.DrainPerSec), perSec(s.BoundPerSec), percent(s.BoundPerSec/s.BasePerSec))
		}
		for _, x := range s.Steps {
			if x.Fraction == sustainedGoalFraction {
				verdict := "meets"
				switch {
				case x.held():
				case x.Lag.Samples > 0 && x.Lag.P99 >= float64(MaxLag.Milliseconds()):
					verdict = "above"
				default:
					verdict = "misses" // its ledger check failed, or it could not sample
				}
				line += fmt.Sprintf("; at %s, lag p99 %s (%s goal < %s)", percent(x.Fraction), lagText(x.Lag.P99, x.Lag.Samples), verdict, MaxLag)
			}
		}
		if reads, gaps := sampling(s.Steps); reads > 0 {
			line += fmt.Sprintf("; a read of the outbox took a median %s, so its samples came every %s (median)", millis(reads), millis(gaps))
		}
		out = append(out, line)
		for _, x := range s.Steps {
			if x.Check == nil {
				continue
			}
			checked++
			if x.Check.OK {
				held++
				continue
			}
			out = append(out, fmt.Sprintf("(ledger) sustained %s at %s: %s", s.Store, percent(x.Fraction), strings.Join(x.Check.Failures, "; ")))
		}
		for _, x := range s.Steps {
			if x.Error != "" {
				out = append(out, fmt.Sprintf("(!) sustained %s at %s: %s", s.Store, percent(x.Fraction), x.Error))
			}
		}
	}
	switch {
	case checked == 0:
	case held == checked:
		out = append(out, fmt.Sprintf("ledger (sustained): %d of %d steps hold: each key answered 201 has exactly one charge, the run's charges are exactly those answered, each with one outbox event, delivered once drained.", held, checked))
	default:
		out = append(out, fmt.Sprintf("ledger (sustained): %d of %d steps FAILED their check.", checked-held, checked))
	}
	if searched {
		out = append(out, fmt.Sprintf("sustained (search): after the fractions, each step offers the rate halfway (geometrically) between the highest that held and the lowest whose lag did not; below the lowest that lagged, half of it or the relay's drain rate of the store's fresh phases, whichever is lower; it stops when the two are within %.0f %% of each other.", 100*(searchClose-1)))
	}
	if checked > 0 {
		out = append(out, "sustained: lag is the oldest pending event's age as sampled while the load ran; delivered the events the relay delivered per second meanwhile, settled those whose capture's webhooks the lab had acknowledged (webhooks acknowledged over webhooks per event); backlog the events pending when the load stopped, drain how long they then took. The pacer uses the phase's connections: when all wait, the rate sent falls short of the rate offered.")
	}
	return out
}

// notes are the lines under the table.
func (r *Result) notes() []string {
	var out []string
	for _, p := range r.ordered() {
		switch {
		case p.Error != "":
			out = append(out, fmt.Sprintf("(!) %s could not run: %s", p.name(r.Repeat), p.Error))
		case p.Non2xx > 0:
			out = append(out, fmt.Sprintf("(!) %s: %s of %s answers were not 2xx (%s)", p.name(r.Repeat), thousands(p.Non2xx), thousands(int(p.Requests)), codes(p.StatusCodes, p.Errors)))
		}
	}
	primed := map[string]bool{}
	for _, p := range r.ordered() {
		if p.Primed > 1 && !primed[p.Path()] {
			primed[p.Path()] = true
			out = append(out, fmt.Sprintf("%s: priming the key charged it %d times, once per replica: each keeps its own keys", p.Path(), p.Primed))
		}
	}
	checked, held := 0, 0
	for _, p := range r.Phases {
		if p.Check == nil {
			continue
		}
		checked++
		if p.Check.OK {
			held++
			continue
		}
		out = append(out, fmt.Sprintf("(ledger) %s: %s", p.name(r.Repeat), strings.Join(p.Check.Failures, "; ")))
	}
	if checked > 0 {
		if held == checked {
			out = append(out, fmt.Sprintf("ledger: all %d phases hold: each key answered 201 has exactly one charge and the run's charges are exactly those answered (unsafe: one charge per 201), each (but unsafe's) with one outbox event, delivered; a replay charged nothing.", checked))
		} else {
			out = append(out, fmt.Sprintf("ledger: %d of %d phases FAILED their check.", checked-held, checked))
		}
	}
	if line := r.deliveryNote(); line != "" {
		out = append(out, line)
	}
	out = append(out, r.sustainedNotes()...)
	for _, s := range r.Skipped {
		what := "skipped"
		if s.Kind != "" {
			what = string(s.Kind) + " skipped"
		}
		out = append(out, fmt.Sprintf("%s: %s: %s", s.Store, what, s.Reason))
	}
	measured := map[string]bool{}
	for _, c := range r.CeilingSummaries {
		measured[c.ID] = c.Status == Measured
	}
	for _, c := range r.Ceilings {
		if c.Status != Measured && measured[c.ID] { // measured in another round
			out = append(out, fmt.Sprintf("ceiling %s, round %d: %s", c.Name, c.Round, c.Status))
		}
	}
	for _, c := range r.CeilingSummaries {
		if c.Status != Measured {
			out = append(out, fmt.Sprintf("ceiling %s: %s", c.Name, c.Status))
			continue
		}
		how, spread := "", ""
		if c.Command != "" {
			how = " — `" + c.Command + "`"
		}
		if c.PerSec.N > 1 {
			spread = fmt.Sprintf(" (median of %d rounds, %s)", c.PerSec.N, spreadText(c.PerSec))
		}
		latency := ""
		if c.LatencyMS > 0 {
			latency = ", " + millis(c.LatencyMS) + " average"
		}
		out = append(out, fmt.Sprintf("ceiling %s: %s/s%s%s%s", c.Name, perSec(c.PerSec.Median), spread, latency, how))
	}
	for _, c := range r.Concurrent {
		wall := millis(c.MedianWallMS)
		var about []string
		if c.Wall.N > 1 {
			about = append(about, millis(c.Wall.Min)+"–"+millis(c.Wall.Max))
		}
		if c.GoalWallMS > 0 && c.Runs > 0 {
			verdict := "meets"
			if c.MedianWallMS >= c.GoalWallMS {
				verdict = "above"
			}
			about = append(about, fmt.Sprintf("%s goal < %s", verdict, millis(c.GoalWallMS)))
		}
		if len(about) > 0 {
			wall += " (" + strings.Join(about, "; ") + ")"
		}
		line := fmt.Sprintf("%d concurrent attempts on %s (`/charge-idempotent?attempts=%d&key=fresh`), median of %d runs: wall %s, barrier spread %s",
			Attempts, c.Store, Attempts, c.Runs, wall, millis(c.MedianSpreadMS))
		if c.Store == "unsafe" {
			line = strings.Replace(line, "/charge-idempotent?", "/charge-unsafe?", 1)
		}
		if len(c.Verdicts) > 0 {
			vs := make([]string, 0, len(c.Verdicts))
			for v, n := range c.Verdicts {
				vs = append(vs, fmt.Sprintf("%s ×%d", v, n))
			}
			slices.Sort(vs)
			line += " (" + strings.Join(vs, ", ") + ")"
		}
		if c.Error != "" {
			line += "; FAILED: " + c.Error
		}
		out = append(out, line)
	}
	return out
}

// costRows are the cost table: each path of the first round on one
// replica, and the settled effect after each fresh phase, beside what its
// design cannot do without.
func (r *Result) costRows() [][]string {
	rows := [][]string{{"operation", "HTTP to/from provider", "Redis round trips", "SQL statements", "commits", "the design's least, and why more"}}
	row := func(what string, c *cost.Counts, least string) {
		commits := fmt.Sprintf("%.2f + %.2f", cost.Sum(c.DurableCommits), cost.Sum(c.AsyncCommits))
		rows = append(rows, []string{what, fmt.Sprintf("%.2f", cost.Sum(c.HTTPOut)+cost.Sum(c.HTTPIn)), fmt.Sprintf("%.2f", c.RedisTrips),
			fmt.Sprintf("%.1f", cost.Sum(c.Statements)), commits, least})
	}
	for _, p := range r.ordered() {
		if p.Round != 1 || p.Replicas != 1 || p.Cost == nil {
			continue
		}
		row(p.Path(), p.Cost, leastCost(p.Store, p.Kind))
		if d := p.Delivery; d != nil && d.Cost != nil {
			row(string(p.Store)+" effect, settled", d.Cost, leastCost("", "effect"))
		}
	}
	return rows
}

// leastCost says what a path cannot do without in its design, and what it
// takes beyond that, as the code does it.
func leastCost(store lab.StoreName, kind Kind) string {
	fresh := kind == FreshHot || kind == FreshMany
	switch {
	case kind == "effect":
		return "2 HTTP and 2 durable commits (the capture with its receipt; the outcome's webhook); capture.processing adds 1 of each; async: the relay's capture record and fenced completion, the provider's webhook claims and acks"
	case store == "unsafe" && fresh:
		return "1 commit (the ledger); no key; its capture is 1 HTTP call inside the write"
	case store == "memory" && fresh:
		return "1 commit: charge, event and balance in one transaction; the key in the heap"
	case store == "redis" && fresh:
		return "2 round trips (SET NX GET claim, compare-and-swap completion) + 1 commit; 1 more lists the key in its scope, for /idempotency/state and resets"
	case store == "postgres" && fresh:
		return "1 commit: key, charge, event and balance in one transaction; SET LOCAL lock_timeout bounds the wait on a twin"
	case store == "memory" && kind == Replay:
		return "nothing but the heap"
	case store == "redis" && kind == Replay:
		return "1 round trip: the claim's SET NX GET answers the stored response"
	case store == "postgres" && kind == Replay:
		return "0 commits; 1 read would do: it claims first (a transaction, its lock_timeout, the refused INSERT), then reads and rolls back"
	}
	return ""
}

// deliveryNote summarises how fast the relay drained the fresh phases'
// events once resumed.
func (r *Result) deliveryNote() string {
	var rates []float64
	held := false
	for _, p := range r.Phases {
		if p.Delivery != nil {
			rates = append(rates, p.Delivery.PerSec)
			held = held || p.Delivery.Held
		}
	}
	if len(rates) == 0 {
		return ""
	}
	slices.Sort(rates)
	how := "drained"
	if held {
		how = "held during each fresh phase, so the phase measures the charge path alone as pgbench does its statements; resumed, it drained"
	}
	return fmt.Sprintf("delivery: the outbox relay was %s each phase's events (relay → provider → its webhooks) at %s–%s events/s, median %s",
		how, perSec(rates[0]), perSec(rates[len(rates)-1]), perSec(median(rates)))
}

// codes writes a status histogram, most frequent first, and the first error.
func codes(sc map[string]int, errs []string) string {
	keys := make([]string, 0, len(sc))
	for k := range sc {
		if !strings.HasPrefix(k, "2") {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b string) int { return sc[b] - sc[a] })
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		name := k
		if k == "0" {
			name = "no answer"
		}
		parts = append(parts, fmt.Sprintf("%s ×%s", name, thousands(sc[k])))
	}
	s := strings.Join(parts, ", ")
	if len(errs) > 0 {
		s += ": " + errs[0]
	}
	return s
}
