package experiment

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/reconcile"
)

// The effects matrix is the second half of the lesson: the charge is in the
// ledger, but its capture and receipt happen at the provider, and no
// transaction spans the two. Each cell charges once (and retries once when
// the first attempt fails, as a client does), lets the provider misbehave,
// waits until everything settled, and compares the ledger with what the
// provider itself recorded.

// EffectDesign is one way a charge's effects leave the lab (a column).
type EffectDesign struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	// Transport is the variant Effects value it runs on: "direct" or "outbox".
	Transport  string `json:"transport"`
	RandomKey  bool   `json:"random_key"` // the relay keys each capture at random
	usual      map[string]lab.Verdict
	holds, why map[string]string
}

// Effect design names.
const (
	DesignDirect         = "direct"
	DesignOutboxRandom   = "outbox_random_key"
	DesignOutboxDerived  = "outbox_derived_key"
	caseProviderDown     = "provider_down"
	caseResponseLost     = "applied_response_lost"
	caseWebhooksMangled  = "webhooks_duplicated_reordered_forged"
	caseSentThenReverted = "sent_then_reverted"
)

// EffectCase is one way the world misbehaves (a row).
type EffectCase struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	// Provider is what the provider does wrong to the namespace during the
	// cell, until the cell lifts it.
	Provider provider.Faults `json:"provider_faults"`
	// Fault is injected into the first attempt (the write fails after the
	// provider was called).
	Fault lab.FaultPoint `json:"fault,omitempty"`
}

// EffectCases are the rows.
func EffectCases() []EffectCase {
	return []EffectCase{
		{Name: caseProviderDown, Title: "the provider is down, then back", Provider: provider.Faults{Down: true}},
		{Name: caseResponseLost, Title: "the provider applies the capture, its answer is lost", Provider: provider.Faults{AppliedResponseLost: 1}},
		{Name: caseWebhooksMangled, Title: "webhooks duplicated, out of order, and a forged one",
			Provider: provider.Faults{WebhookDuplicate: true, WebhookReorder: true, WebhookBadSignature: true}},
		{Name: caseSentThenReverted, Title: "the write fails after the effect was sent (email sent, charge reverted)", Fault: lab.FaultOutboxFail},
	}
}

// EffectDesigns are the columns, with what each one usually does per case
// and why.
func EffectDesigns() []EffectDesign {
	return []EffectDesign{
		{Name: DesignDirect, Title: "direct call, no outbox", Transport: "direct",
			usual: map[string]lab.Verdict{caseProviderDown: lab.Breaks, caseResponseLost: lab.Breaks, caseWebhooksMangled: lab.Holds, caseSentThenReverted: lab.Breaks},
			holds: map[string]string{
				caseWebhooksMangled: "webhooks are deduplicated by event id and the state machine never moves a final state: however the capture was sent",
			},
			why: map[string]string{
				caseProviderDown:     "the call failed and nothing remembers it: the charge stands, never captured, no receipt",
				caseResponseLost:     "the call timed out after the provider captured; nothing retries it, and the lab never learned the capture: its webhooks cannot be placed",
				caseSentThenReverted: "the provider was called inside the write that then failed: it captured a charge the ledger rolled back, and the retry was captured again",
			}},
		{Name: DesignOutboxRandom, Title: "outbox, a random key per delivery", Transport: "outbox", RandomKey: true,
			usual: map[string]lab.Verdict{caseProviderDown: lab.Holds, caseResponseLost: lab.Breaks, caseWebhooksMangled: lab.Holds, caseSentThenReverted: lab.Holds},
			holds: map[string]string{
				caseProviderDown:     "every failed attempt failed before the provider applied anything, so the redelivery captured once",
				caseWebhooksMangled:  "webhooks are deduplicated by event id and the state machine never moves a final state",
				caseSentThenReverted: "the event was written in the charge's transaction and rolled back with it; the retry's event was delivered once",
			},
			why: map[string]string{
				caseResponseLost: "the redelivery came with a new key, so the provider could not tell it from a new capture: captured twice",
			}},
		{Name: DesignOutboxDerived, Title: "outbox, key <charge id>:capture", Transport: "outbox",
			usual: map[string]lab.Verdict{caseProviderDown: lab.Holds, caseResponseLost: lab.Holds, caseWebhooksMangled: lab.Holds, caseSentThenReverted: lab.Holds},
			holds: map[string]string{
				caseProviderDown:     "the event waited in the outbox and was delivered once the provider was back",
				caseResponseLost:     "the redelivery carried the same key, derived from the charge: the provider replayed its capture instead of capturing again",
				caseWebhooksMangled:  "webhooks are deduplicated by event id and the state machine never moves a final state",
				caseSentThenReverted: "the event was written in the charge's transaction and rolled back with it; the retry's event was delivered once",
			}},
	}
}

// EffectCell is one (case, design) result, from the ledger and the
// provider's own records.
type EffectCell struct {
	Design            string      `json:"design"`
	Store             string      `json:"store"`
	RunID             string      `json:"run_id"`
	Charges           int         `json:"ledger_charges"`
	Captures          int         `json:"provider_captures"`
	CaptureCalls      int         `json:"provider_capture_calls"`
	Receipts          int         `json:"provider_receipts"`
	Paid              int         `json:"charges_paid"` // moved to their capture's state by a verified webhook
	Findings          []string    `json:"findings"`     // reconciliation problems, one per charge that disagrees
	Verdict           lab.Verdict `json:"verdict"`
	ExpectedVerdict   lab.Verdict `json:"expected_verdict"`
	Explanation       string      `json:"explanation"`
	Evidence          string      `json:"evidence"`
	FirstAttemptCode  int         `json:"first_attempt_status"`
	RetriedAfterError bool        `json:"retried"`
}

// EffectRow is one case across the designs.
type EffectRow struct {
	Case  EffectCase   `json:"case"`
	Cells []EffectCell `json:"cells"`
}

// EffectMatrix is every design against every case.
type EffectMatrix struct {
	Designs []EffectDesign `json:"designs"`
	Rows    []EffectRow    `json:"rows"`
	WallMS  float64        `json:"wall_ms"`
}

// EffectsRequest says where and as whom to run.
type EffectsRequest struct {
	Target    string // one replica's base URL
	Tenant    string
	Token     string
	Namespace lab.Namespace
	// Stores run each transport: a variant whose effects are sent
	// directly, and a keyed one writing an outbox.
	Stores   map[string]lab.StoreName
	Account  string
	Amount   int64
	Progress func(done, total int, c EffectCase, d EffectDesign)
}

// effectSettle bounds how long a cell waits for its effects to settle.
const effectSettle = 30 * time.Second

// RunEffects runs every case on every design, one cell after the other:
// the provider's faults are the namespace's while a cell runs.
func (r *Runner) RunEffects(ctx context.Context, req EffectsRequest) (EffectMatrix, error) {
	start := time.Now()
	m := EffectMatrix{Designs: EffectDesigns()}
	cases := EffectCases()
	total, done := len(cases)*len(m.Designs), 0
	defer func() {
		// Whatever happened, the namespace's provider is left well.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = r.Provider.ClearFaults(cctx, string(req.Namespace))
	}()
	for _, c := range cases {
		row := EffectRow{Case: c}
		for _, d := range m.Designs {
			cell, err := r.effectCell(ctx, req, c, d)
			if err != nil {
				return m, fmt.Errorf("error running %s with %s: %w", c.Name, d.Name, err)
			}
			row.Cells = append(row.Cells, cell)
			done++
			if req.Progress != nil {
				req.Progress(done, total, c, d)
			}
		}
		m.Rows = append(m.Rows, row)
	}
	m.WallMS = ms(time.Since(start))
	return m, nil
}

// effectCell charges once under the case's faults, retries once if that
// failed, lifts the faults when they did their part, and reads the outcome
// once the relay and the webhooks settled.
func (r *Runner) effectCell(ctx context.Context, req EffectsRequest, c EffectCase, d EffectDesign) (EffectCell, error) {
	store := req.Stores[d.Transport]
	cell := EffectCell{Design: d.Name, Store: string(store), RunID: "eff_" + uuid.NewString(), ExpectedVerdict: d.usual[c.Name]}
	ns := string(req.Namespace)
	if err := r.Books.OpenRun(ctx, req.Namespace, cell.RunID); err != nil {
		return cell, fmt.Errorf("error opening the cell's run: %w", err)
	}
	if c.Provider != (provider.Faults{}) {
		if err := r.Provider.SetFaults(ctx, ns, c.Provider); err != nil {
			return cell, fmt.Errorf("error setting the provider's faults: %w", err)
		}
	}
	key := "effects-" + cell.RunID
	labFaults := lab.Faults{Point: c.Fault, RandomCaptureKey: d.RandomKey}
	status, err := r.effectCharge(ctx, req, store, key, cell.RunID, labFaults)
	if err != nil {
		return cell, err
	}
	cell.FirstAttemptCode = status
	if status != http.StatusCreated {
		cell.RetriedAfterError = true
		labFaults.Point = lab.FaultNone // the retry is a plain one
		if _, err := r.effectCharge(ctx, req, store, key, cell.RunID, labFaults); err != nil {
			return cell, err
		}
	}
	if err := r.liftWhenDone(ctx, req, c, d, cell.RunID); err != nil {
		return cell, err
	}
	rep, stats, err := r.settleEffects(ctx, req.Namespace, cell.RunID)
	if err != nil {
		return cell, err
	}
	if err := r.Provider.ClearFaults(ctx, ns); err != nil {
		return cell, fmt.Errorf("error clearing the provider's faults: %w", err)
	}
	cell.Charges, cell.Captures, cell.CaptureCalls, cell.Receipts = rep.ChargesChecked, stats.CapturesApplied, stats.CaptureRequests, stats.Receipts
	cell.Paid = rep.Agree
	cell.Findings = []string{}
	for _, f := range rep.Findings {
		cell.Findings = append(cell.Findings, f.Problem)
	}
	cell.Verdict = lab.Holds
	if rep.Disagree > 0 || rep.Pending > 0 || stats.Receipts != rep.ChargesChecked || stats.ChargesCapturedTwice > 0 || rep.ChargesChecked == 0 {
		cell.Verdict = lab.Breaks
	}
	cell.Evidence = fmt.Sprintf("ledger: %d charge(s), %d paid by a verified webhook; provider: %d capture(s) from %d call(s), %d receipt(s)",
		cell.Charges, cell.Paid, cell.Captures, cell.CaptureCalls, cell.Receipts)
	if len(cell.Findings) > 0 {
		cell.Evidence += "; reconciliation: " + strings.Join(cell.Findings, ", ")
	}
	cell.Explanation = d.holds[c.Name]
	if cell.Verdict == lab.Breaks {
		cell.Explanation = d.why[c.Name]
	}
	if cell.Explanation == "" || cell.Verdict != cell.ExpectedVerdict {
		cell.Explanation = "unusual for this design: " + cell.Evidence
	}
	return cell, nil
}

// effectCharge sends one charge and returns its status.
func (r *Runner) effectCharge(ctx context.Context, req EffectsRequest, store lab.StoreName, key, run string, f lab.Faults) (int, error) {
	body, _ := json.Marshal(map[string]any{"account": req.Account, "amount_cents": req.Amount, "currency": "USD"})
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, req.Target+"/charges?store="+string(store), bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("error building a charge: %w", err)
	}
	hr.GetBody = nil // sent once, as fire.go's: the transport would resend a keyed request by itself
	hr.Header.Set("Authorization", "Bearer "+req.Token)
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set(lab.KeyHeader, wire.FormatKeyHeader(key))
	hr.Header.Set("Lab-Run", run)
	if h := f.String(); h != "" {
		hr.Header.Set(lab.FaultHeader, h)
	}
	resp, err := r.Client.Do(hr)
	if err != nil {
		return 0, fmt.Errorf("error sending a charge: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// liftWhenDone clears the provider's faults once they did their part: the
// down provider refused a delivery; otherwise the capture was applied
// (its answer lost, or its webhooks planned).
// A direct send happened during the charge, so its faults lift at once.
func (r *Runner) liftWhenDone(ctx context.Context, req EffectsRequest, c EffectCase, d EffectDesign, run string) error {
	if c.Provider == (provider.Faults{}) || d.Transport == "direct" {
		return r.Provider.ClearFaults(ctx, string(req.Namespace))
	}
	deadline := time.Now().Add(effectSettle)
	for {
		done := false
		switch {
		case c.Provider.Down:
			evs, err := r.Books.Events(ctx, req.Namespace, 50)
			if err != nil {
				return fmt.Errorf("error reading the outbox: %w", err)
			}
			for _, ev := range evs {
				done = done || (ev.Run == run && (ev.Attempts > 1 || ev.LastError != ""))
			}
		default:
			st, err := r.Provider.Stats(ctx, provider.Filter{Namespace: string(req.Namespace), Run: run})
			if err != nil {
				return fmt.Errorf("error reading the provider: %w", err)
			}
			done = st.CaptureRequests > 0
		}
		if done {
			return r.Provider.ClearFaults(ctx, string(req.Namespace))
		}
		if time.Now().After(deadline) {
			return errors.New("the provider's fault never came into play")
		}
		if err := lab.Sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// settleEffects waits until the run's events are delivered or dead and
// every captured charge heard its webhooks, then reconciles.
func (r *Runner) settleEffects(ctx context.Context, ns lab.Namespace, run string) (reconcile.Report, provider.StatsReport, error) {
	deadline := time.Now().Add(effectSettle)
	for {
		stats, err := r.Books.RunStats(ctx, ns, run)
		if err != nil {
			return reconcile.Report{}, provider.StatsReport{}, fmt.Errorf("error reading the run: %w", err)
		}
		payments, err := r.Books.Payments(ctx, ns, run, runLimit)
		if err != nil {
			return reconcile.Report{}, provider.StatsReport{}, fmt.Errorf("error reading the run's charges: %w", err)
		}
		captures, err := r.Provider.Captures(ctx, provider.Filter{Namespace: string(ns), Run: run, Limit: runLimit})
		if err != nil {
			return reconcile.Report{}, provider.StatsReport{}, fmt.Errorf("error reading the provider's captures: %w", err)
		}
		rep := reconcile.Compare(payments, captures, false, false)
		if (stats.Delivered+stats.Dead >= stats.OutboxEvents && rep.Pending == 0) || time.Now().After(deadline) {
			got, err := r.Provider.Stats(ctx, provider.Filter{Namespace: string(ns), Run: run})
			return rep, got, err
		}
		if err := lab.Sleep(ctx, 20*time.Millisecond); err != nil {
			return rep, provider.StatsReport{}, err
		}
	}
}

// Mismatches lists the cells whose verdict differs from the design's usual one.
func (m EffectMatrix) Mismatches() []string {
	var out []string
	for _, row := range m.Rows {
		for _, c := range row.Cells {
			if c.Verdict != c.ExpectedVerdict {
				out = append(out, fmt.Sprintf("%s/%s: %s, usually %s (%s)", row.Case.Name, c.Design, c.Verdict, c.ExpectedVerdict, c.Evidence))
			}
		}
	}
	return out
}

// WriteMarkdown writes the verdict table (no figures that vary between runs).
func (m EffectMatrix) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	b.WriteString("| case |")
	for _, d := range m.Designs {
		b.WriteString(" " + d.Title + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(m.Designs)) + "\n")
	for _, row := range m.Rows {
		b.WriteString("| " + row.Case.Title + " |")
		for _, c := range row.Cells {
			if c.Verdict == lab.Holds {
				b.WriteString(" holds |")
			} else {
				b.WriteString(" **breaks** |")
			}
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteTable writes a plain-text table with the evidence of each cell.
func (m EffectMatrix) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%-72s", "case")
	for _, d := range m.Designs {
		fmt.Fprintf(&b, " %-20s", d.Name)
	}
	b.WriteString("\n")
	for _, row := range m.Rows {
		fmt.Fprintf(&b, "%-72s", row.Case.Title)
		for _, c := range row.Cells {
			fmt.Fprintf(&b, " %-20s", string(c.Verdict))
		}
		b.WriteString("\n")
	}
	b.WriteString("\nwhy:\n")
	for _, row := range m.Rows {
		for _, c := range row.Cells {
			fmt.Fprintf(&b, "- %s / %s: %s (%s)\n", row.Case.Name, c.Design, c.Explanation, c.Evidence)
		}
	}
	fmt.Fprintf(&b, "\n%d runs in %.0f ms\n", len(m.Rows)*len(m.Designs), m.WallMS)
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the whole matrix.
func (m EffectMatrix) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(m)
}
