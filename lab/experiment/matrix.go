package experiment

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/history"
	"github.com/idempotency-lab/lab/lab/variant"
)

// Case is one row of the breakage matrix.
type Case struct {
	Name     string     `json:"name"`
	Title    string     `json:"title"`
	Attempts int        `json:"attempts"`
	Replicas int        `json:"replicas"`
	Scenario Scenario   `json:"scenario"`
	Faults   lab.Faults `json:"faults"`
	OrderID  bool       `json:"order_id"`
	// NeedsPair: the case fails Redis over, on the lab's primary and
	// replica pair.
	NeedsPair bool `json:"needs_pair,omitempty"`
	// NeedsPGPair: the case fails PostgreSQL over, on the lab's primary and
	// standby; it applies to the designs that keep their keys there.
	NeedsPGPair bool `json:"needs_pg_pair,omitempty"`
}

// Cases are the matrix's scenarios: the lesson of the brief, row by row.
func Cases() []Case {
	return []Case{
		{Name: "retries", Title: "8 concurrent retries, 1 replica", Attempts: 8, Replicas: 1},
		{Name: "replicas", Title: "9 concurrent retries over 3 replicas", Attempts: 9, Replicas: 3},
		{Name: "slow_short_ttl", Title: "work 300 ms, claim TTL 100 ms", Attempts: 4, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultSlow, Work: 300 * time.Millisecond, ClaimTTL: 100 * time.Millisecond}},
		{Name: "slow_long_ttl", Title: "work 100 ms, claim TTL 1 s", Attempts: 4, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultSlow, Work: 100 * time.Millisecond, ClaimTTL: time.Second}},
		{Name: "crash_after_claim", Title: "crash after the claim, then retries", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultCrashAfterClaim, ClaimTTL: 300 * time.Millisecond}},
		{Name: "crash_after_charge", Title: "crash after the charge (lost response), then retries", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultCrashAfterCharge, ClaimTTL: 300 * time.Millisecond}},
		{Name: "outbox_fail", Title: "the outbox write fails, then retries", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultOutboxFail, ClaimTTL: 300 * time.Millisecond}},
		{Name: "crash_after_phase_1", Title: "crash after phase 1 (the claim and the request recorded), then retries", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultCrashAfterPhase, Phase: 1, ClaimTTL: 300 * time.Millisecond}},
		{Name: "crash_after_phase_2", Title: "crash after phase 2 (the charge), then retries", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultCrashAfterPhase, Phase: 2, ClaimTTL: 300 * time.Millisecond}},
		{Name: "crash_after_phase_3", Title: "crash after phase 3 (the provider's capture), then retries", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultCrashAfterPhase, Phase: 3, ClaimTTL: 300 * time.Millisecond}},
		{Name: "applied_response_lost", Title: "the provider applies the first capture and its answer is lost, then retries", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultAppliedResponseLost, ClaimTTL: 300 * time.Millisecond}},
		{Name: "store_restart", Title: "the store restarts between charge and retry", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultStoreRestart}},
		{Name: "expired", Title: "retry after the retention window", Attempts: 2, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultExpired, Retention: 200 * time.Millisecond}},
		{Name: "expired_order_id", Title: "retry after the window, with an order id", Attempts: 2, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultExpired, Retention: 200 * time.Millisecond}, OrderID: true},
		{Name: "stale_worker", Title: "a worker pauses 1500 ms past its 150 ms lease, a retry takes over, then it writes", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultStaleWorker, Work: 1500 * time.Millisecond, ClaimTTL: 150 * time.Millisecond}},
		{Name: "redis_failover", Title: "Redis (not PostgreSQL) fails over before the first attempt's writes replicated, then retries", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultFailover, OnPair: true, ClaimTTL: 300 * time.Millisecond}, NeedsPair: true},
		{Name: "pg_failover_async", Title: "PostgreSQL fails over, asynchronous replication: the first attempt's commit never reached the standby, then retries", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultPGFailover, Replication: lab.ReplicationAsync}, NeedsPGPair: true},
		{Name: "pg_failover_sync", Title: "PostgreSQL fails over, synchronous replication: the first attempt's commit waits for the standby, then retries", Attempts: 3, Replicas: 1,
			Faults: lab.Faults{Point: lab.FaultPGFailover, Replication: lab.ReplicationSync}, NeedsPGPair: true},
		{Name: "reused", Title: "same key, another amount", Attempts: 3, Replicas: 1, Scenario: ScenarioReused},
		{Name: "tenants", Title: "two tenants, one key", Attempts: 4, Replicas: 1, Scenario: ScenarioTenants},
	}
}

// Cell is one (case, store) result.
type Cell struct {
	Store       lab.StoreName `json:"store"`
	Available   bool          `json:"available"`
	HowToEnable string        `json:"how_to_enable,omitempty"`
	// NotApplicable: the case does not apply to the design (HowToEnable
	// says why), which runs elsewhere.
	NotApplicable   bool `json:"not_applicable,omitempty"`
	ExpectedCharges int  `json:"expected_charges"`
	Charges         int  `json:"charges"`
	// What the provider recorded of the cell's run.
	ProviderCaptures int         `json:"provider_captures"`
	ProviderReceipts int         `json:"provider_receipts"`
	Verdict          lab.Verdict `json:"verdict"`
	ExpectedVerdict  lab.Verdict `json:"expected_verdict"`
	Explanation      string      `json:"explanation"`
	Note             string      `json:"note,omitempty"`
	RunID            string      `json:"run_id,omitempty"`
	// Checked and MoneyHolds are the cell's proof: its history checked for
	// linearizability, its accounts held to the money invariant.
	Checked    history.Verdict `json:"checked,omitempty"`
	MoneyHolds bool            `json:"money_holds"`
	// Run is the whole run behind the cell, timeline included, so a page
	// can open it.
	Run *Report `json:"run,omitempty"`
	// Schedule names the stepped schedule that plays the cell's race move
	// by move (POST /lab/step?schedule=), when it has one.
	Schedule string `json:"schedule,omitempty"`
}

// Row is one case across the stores.
type Row struct {
	Case  Case   `json:"case"`
	Cells []Cell `json:"cells"`
}

// Matrix is every store against every case.
type Matrix struct {
	Stores []lab.StoreName `json:"stores"`
	Rows   []Row           `json:"rows"`
	WallMS float64         `json:"wall_ms"`
	took   time.Duration   // for the text formats
}

// MatrixRequest says what to run.
type MatrixRequest struct {
	Stores []lab.StoreName // in column order; unavailable ones are reported, not run
	// Unavailable says how to enable a store that cannot run here, "" when it can.
	Unavailable func(store lab.StoreName) string
	// PairUnavailable says how to enable the cases that fail Redis over,
	// "" when they can run.
	PairUnavailable string
	// PGPairUnavailable says how to enable the cases that fail PostgreSQL
	// over, on the designs they apply to (Case.AppliesTo), "" when they can run.
	PGPairUnavailable string
	Targets           func(ctx context.Context, n int) ([]string, error)
	Namespace         lab.Namespace // the caller's, as the API resolved it
	Tenant            string        // the namespace's first tenant, and its token
	Token             string
	OtherTenant       string // its second tenant, and its token
	Other             string
	Account           string
	Amount            int64
	// Progress, when set, is told of each cell as it is decided, done and
	// total counting cells: first every cell that does not run, at once,
	// then each run as it ends.
	Progress func(done, total int, c Case, cell Cell)
}

// AppliesTo says whether the case applies to design v, and why not: a
// PostgreSQL failover can lose only what the design keeps in PostgreSQL.
func (c Case) AppliesTo(v variant.Variant) (bool, string) {
	switch {
	case !c.NeedsPGPair:
		return true, ""
	case !v.RequiresKey:
		return false, fmt.Sprintf("`%s` keeps no keys, so the PostgreSQL failover rows do not apply to it", v.Name)
	case !slices.Contains(v.Needs, variant.NeedPostgres):
		return false, fmt.Sprintf("`%s` keeps its keys outside PostgreSQL, so the PostgreSQL failover rows do not apply to it", v.Name)
	}
	return true, ""
}

// PlanMatrix decides every cell before any runs: it runs (Available), does
// not apply to its design, or cannot run here, saying why.
func (r *Runner) PlanMatrix(req MatrixRequest) Matrix {
	m := Matrix{Stores: req.Stores}
	for _, c := range Cases() {
		row := Row{Case: c}
		for _, store := range req.Stores {
			v, _ := r.Variants.Get(store)
			applies, how := c.AppliesTo(v)
			if applies {
				switch how = req.Unavailable(store); {
				case how != "":
				case c.NeedsPair:
					how = req.PairUnavailable
				case c.NeedsPGPair:
					how = req.PGPairUnavailable
				}
			}
			row.Cells = append(row.Cells, Cell{Store: store, Available: how == "", HowToEnable: how, NotApplicable: !applies})
		}
		m.Rows = append(m.Rows, row)
	}
	return m
}

// RunMatrix runs every case on every available store, each on fresh keys.
func (r *Runner) RunMatrix(ctx context.Context, req MatrixRequest) (Matrix, error) {
	start := time.Now()
	m := r.PlanMatrix(req)
	total, done := len(m.Rows)*len(m.Stores), 0
	told := func(c Case, cell Cell) {
		done++
		if req.Progress != nil {
			req.Progress(done, total, c, cell)
		}
	}
	for _, row := range m.Rows { // what does not run is told first: nobody waits for it
		for _, cell := range row.Cells {
			if !cell.Available {
				told(row.Case, cell)
			}
		}
	}
	batch := uuid.NewString()[:8]
	for _, row := range m.Rows {
		for i := range row.Cells {
			cell := &row.Cells[i]
			if !cell.Available {
				continue
			}
			rep, err := r.runCase(ctx, req, row.Case, cell.Store, batch, "")
			if err == nil && rep.Verdict == lab.Inconclusive {
				// A run that says nothing of the store (its fault not
				// staged, an attempt unanswered on a busy machine) is run
				// once more, on a key of its own, and the cell says so.
				first := rep
				if rep, err = r.runCase(ctx, req, row.Case, cell.Store, batch, "-again"); err == nil {
					rep.Note = strings.TrimPrefix(rep.Note+"; run twice: the first run, "+first.RunID+", was inconclusive: "+first.Reason, "; ")
				}
			}
			if err != nil {
				return m, fmt.Errorf("error running %s on %s: %w", row.Case.Name, cell.Store, err)
			}
			cell.ExpectedCharges, cell.Charges = rep.ExpectedCharges, rep.KeyCharges
			cell.ProviderCaptures, cell.ProviderReceipts = rep.ProviderCaptures, rep.ProviderReceipts
			cell.Verdict, cell.ExpectedVerdict = rep.Verdict, rep.ExpectedVerdict
			cell.Explanation, cell.Note, cell.RunID = rep.Explanation, rep.Note, rep.RunID
			cell.Checked, cell.MoneyHolds = rep.Checked, rep.Money.Holds
			cell.Run = &rep
			told(row.Case, *cell)
		}
	}
	m.took = time.Since(start)
	m.WallMS = ms(m.took)
	return m, nil
}

func (r *Runner) runCase(ctx context.Context, req MatrixRequest, c Case, store lab.StoreName, batch, again string) (Report, error) {
	// Every key of the batch starts with one prefix, and the cells' crashes
	// and restarts are confined to it: the caller's own keys outlive the
	// matrix.
	confine := MatrixKeyPrefix(batch)
	key := fmt.Sprintf("%s%s-%s%s", confine, c.Name, store, again)
	spec := Spec{
		Store: store, Scenario: c.Scenario, Key: key, Account: req.Account, AmountCents: req.Amount, Namespace: req.Namespace,
		Attempts: c.Attempts, Tenant: req.Tenant, Token: req.Token, OtherTenant: req.OtherTenant, OtherToken: req.Other, Faults: c.Faults,
		Confine: confine, Matrix: batch,
	}
	if c.OrderID {
		spec.OrderID = "order-" + key
	}
	targets, err := req.Targets(ctx, c.Replicas)
	if err != nil {
		return Report{}, err
	}
	return r.Run(ctx, spec, targets)
}

// MatrixKeyPrefix starts every key of one matrix batch.
func MatrixKeyPrefix(batch string) string { return "matrix-" + batch + "-" }

// Disagreements lists the cells whose proof does not agree with their
// verdict: a break the checker did not find (no violation, the money
// whole), a hold it found a violation in, or a check that could not say.
func (m Matrix) Disagreements() []string {
	var out []string
	for _, row := range m.Rows {
		for _, c := range row.Cells {
			if !c.Available {
				continue
			}
			proven := c.Checked == history.Violation || !c.MoneyHolds
			var why, money string
			if c.Run != nil {
				why, money = c.Run.CheckedWhy, c.Run.Money.Why
			}
			switch {
			case c.Checked == history.Unknown || c.Checked == "":
				out = append(out, fmt.Sprintf("%s/%s: %s, the check could not say (%q)", row.Case.Name, c.Store, c.Verdict, why))
			case c.Verdict == lab.Breaks && !proven:
				out = append(out, fmt.Sprintf("%s/%s: breaks (%d charges), yet the history is %s and the money holds", row.Case.Name, c.Store, c.Charges, c.Checked))
			case c.Verdict == lab.Holds && proven:
				out = append(out, fmt.Sprintf("%s/%s: holds, yet the history is %s (%s) and the money: %s", row.Case.Name, c.Store, c.Checked, why, money))
			}
		}
	}
	return out
}

// Mismatches lists the cells whose verdict differs from the design's usual one.
func (m Matrix) Mismatches() []string {
	var out []string
	for _, row := range m.Rows {
		for _, c := range row.Cells {
			if c.Available && c.Verdict != c.ExpectedVerdict {
				out = append(out, fmt.Sprintf("%s/%s: %s, usually %s (%d charges)", row.Case.Name, c.Store, c.Verdict, c.ExpectedVerdict, c.Charges))
			}
		}
	}
	return out
}

// WriteMarkdown writes the verdict table; it holds no timings or counts that
// vary between runs, so it can be compared with the README's copy.
func (m Matrix) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	b.WriteString("| case | expected charges |")
	for _, s := range m.Stores {
		b.WriteString(" `" + string(s) + "` |")
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(m.Stores)) + "\n")
	for _, row := range m.Rows {
		fmt.Fprintf(&b, "| %s | %d |", row.Case.Title, expectedCharges(row))
		for _, c := range row.Cells {
			switch {
			case !c.Available:
				b.WriteString(" n/a |")
			case c.Verdict == lab.Holds:
				b.WriteString(" holds |")
			case c.Verdict == lab.Inconclusive:
				b.WriteString(" inconclusive |")
			default:
				b.WriteString(" **breaks** |")
			}
		}
		b.WriteString("\n")
	}
	b.WriteString(m.notRun())
	_, err := io.WriteString(w, b.String())
	return err
}

// notRun says, below a table, how to enable each store whose cells say n/a.
func (m Matrix) notRun() string {
	var b strings.Builder
	seen := map[lab.StoreName]bool{}
	for _, row := range m.Rows {
		for _, c := range row.Cells {
			switch {
			case c.Available || seen[c.Store+lab.StoreName(c.HowToEnable)]:
			case c.NotApplicable:
				fmt.Fprintf(&b, "\nn/a: %s\n", c.HowToEnable)
			default:
				fmt.Fprintf(&b, "\nn/a: `%s` did not run here: %s\n", c.Store, c.HowToEnable)
			}
			seen[c.Store+lab.StoreName(c.HowToEnable)] = true
		}
	}
	return b.String()
}

// Runs counts the cells that run (that ran, once the matrix has).
func (m Matrix) Runs() int {
	n := 0
	for _, row := range m.Rows {
		for _, c := range row.Cells {
			if c.Available {
				n++
			}
		}
	}
	return n
}

func expectedCharges(row Row) int {
	if row.Case.Scenario == ScenarioTenants {
		return 2
	}
	return 1
}

// WriteTable writes a plain-text table with the ledger's counts and why.
func (m Matrix) WriteTable(w io.Writer) error {
	var b strings.Builder
	// Every column as wide as its widest entry, so no title or cell pushes
	// the ones after it out of line.
	head := "case (charges in the ledger / expected)"
	widths := make([]int, len(m.Stores)+1)
	widths[0] = len(head)
	for i, s := range m.Stores {
		widths[i+1] = len(s)
	}
	cells := make([][]string, len(m.Rows))
	for r, row := range m.Rows {
		widths[0] = max(widths[0], len(row.Case.Title))
		for i, c := range row.Cells {
			cell := "n/a"
			if c.Available {
				cell = fmt.Sprintf("%s %d/%d", string(c.Verdict), c.Charges, c.ExpectedCharges)
			}
			cells[r] = append(cells[r], cell)
			widths[i+1] = max(widths[i+1], len(cell))
		}
	}
	line := func(first string, rest []string) {
		l := fmt.Sprintf("%-*s", widths[0], first)
		for i, c := range rest {
			l += fmt.Sprintf("  %-*s", widths[i+1], c)
		}
		b.WriteString(strings.TrimRight(l, " ") + "\n")
	}
	names := make([]string, len(m.Stores))
	for i, s := range m.Stores {
		names[i] = string(s)
	}
	line(head, names)
	for r, row := range m.Rows {
		line(row.Case.Title, cells[r])
	}
	b.WriteString("\nwhy:\n")
	for _, row := range m.Rows {
		for _, c := range row.Cells {
			if c.Available {
				fmt.Fprintf(&b, "- %s / %s: %s\n", row.Case.Name, c.Store, c.Explanation)
			}
		}
	}
	b.WriteString(m.notRun())
	fmt.Fprintf(&b, "\n%d runs in %s\n", m.Runs(), m.took.Round(time.Millisecond))
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the whole matrix.
func (m Matrix) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(m)
}
