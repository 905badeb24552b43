package history

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Verdict is what the check found.
type Verdict string

// Verdicts of a check.
const (
	Linearizable Verdict = "linearizable" // one order of the operations explains every answer
	Violation    Verdict = "violation"    // none does
	Unknown      Verdict = "unknown"      // the check ran out of time before it could say
)

// Result is a checked history.
type Result struct {
	Verdict Verdict `json:"checked"`
	// Why says, in a sentence, which operations no order explains (for a
	// violation), or why the check could not say.
	Why  string `json:"why,omitempty"`
	Ops  int    `json:"ops"`
	Took time.Duration
	info porcupine.LinearizationInfo
	// searched says info holds porcupine's search; a violation shown
	// outright needs none, and its picture searches only when drawn.
	searched bool
	h        History
}

// drawSearch bounds the search a picture of an outright violation makes
// for its partial orders: the picture, not the verdict, needs them.
const drawSearch = 200 * time.Millisecond

// DefaultTimeout bounds one check: a run's history takes milliseconds.
const DefaultTimeout = time.Second

// Check checks h against the model, for at most timeout.
func Check(h History, timeout time.Duration) Result {
	start := time.Now()
	ops := porcupineOps(h)
	for _, k := range h.Keys() {
		var kops []Op
		for _, o := range h.Ops {
			if o.Key == k {
				kops = append(kops, o)
			}
		}
		if why := outright(k, kops); why != "" {
			return Result{Verdict: Violation, Why: why, Ops: len(ops), h: h, Took: time.Since(start)}
		}
	}
	res, info := porcupine.CheckOperationsVerbose(model(), ops, timeout)
	r := Result{Ops: len(ops), info: info, searched: true, h: h, Took: time.Since(start)}
	switch res {
	case porcupine.Ok:
		r.Verdict = Linearizable
	case porcupine.Illegal:
		r.Verdict, r.Why = Violation, explain(h)
	default:
		r.Verdict = Unknown
		r.Why = fmt.Sprintf("the check of %d operations did not finish within %s", len(ops), timeout)
	}
	return r
}

// porcupineOps are h's operations as porcupine takes them: one client per
// attempt (the ledger reads one more), and an operation whose answer never
// came left open until the end of the history, since its effect may land
// any time after its call.
func porcupineOps(h History) []porcupine.Operation {
	end, ledger := int64(0), 0
	for _, o := range h.Ops {
		end = max(end, o.ReturnUS)
		ledger = max(ledger, o.Client)
	}
	out := make([]porcupine.Operation, 0, len(h.Ops))
	for _, o := range h.Ops {
		client := o.Client - 1
		if o.Kind == LedgerRead {
			client = ledger
		}
		ret := o.ReturnUS
		if o.Unknown() {
			ret = end + 1
		}
		out = append(out, porcupine.Operation{ClientId: max(client, 0), Input: o, Output: o, Call: o.CallUS, Return: ret})
	}
	return out
}

// explain finds, key by key, the answers no single charge explains, and
// says so in words an attendee reads: who was told what, and what the
// ledger holds.
func explain(h History) string {
	for _, k := range h.Keys() {
		var ops []Op
		for _, o := range h.Ops {
			if o.Key == k {
				ops = append(ops, o)
			}
		}
		if why := explainKey(k, ops); why != "" {
			return why
		}
	}
	return "no order of the operations explains every answer (open the history's picture to see where the partial orders stop)"
}

func explainKey(k Key, ops []Op) string {
	if why := outright(k, ops); why != "" {
		return why
	}
	// A refusal with nothing to refuse for.
	var charged bool
	for _, o := range ops {
		charged = charged || o.Kind == LedgerRead && o.Before && len(o.Charges) > 0 ||
			o.success() && o.ChargeID != ""
	}
	for _, o := range ops {
		if o.Kind == Charge && o.Status == 422 && !charged {
			return fmt.Sprintf("key %q of %s: attempt %d was refused with 422, though nothing had charged the key", k.Key, k.Tenant, o.Client)
		}
	}
	return ""
}

// outright finds a violation of one key that its answers or its ledger
// reads show whatever the order: two charges answered, a new charge for a
// key charged before the run, a ledger holding more than one charge of the
// run, or two requests answered 2xx under one key. Each is a proof: no
// order of any operations can explain it, so it needs no search (which,
// for many concurrent attempts, can take longer than any bound).
func outright(k Key, ops []Op) string {
	var base []string
	told := map[string][]int{} // charge id -> the attempts told it
	var ids []string
	for _, o := range ops {
		switch {
		case o.Kind == LedgerRead && o.Before:
			base = o.Charges
		case o.success() && o.ChargeID != "":
			if _, seen := told[o.ChargeID]; !seen {
				ids = append(ids, o.ChargeID)
			}
			if !slices.Contains(told[o.ChargeID], o.Client) {
				told[o.ChargeID] = append(told[o.ChargeID], o.Client)
			}
		}
	}
	name := fmt.Sprintf("key %q of %s", k.Key, k.Tenant)
	// Two charges answered for one key.
	var fresh []string
	for _, id := range ids {
		if !slices.Contains(base, id) {
			fresh = append(fresh, id)
		}
	}
	if len(fresh) > 1 {
		parts := make([]string, len(fresh))
		for i, id := range fresh {
			parts[i] = fmt.Sprintf("%s told %s", were(told[id]), short(id))
		}
		return fmt.Sprintf("%s: %s — %d charges for one key", name, strings.Join(parts, ", "), len(fresh))
	}
	if len(base) > 0 && len(fresh) > 0 {
		return fmt.Sprintf("%s: %s told %s, a new charge, though the key was charged before the run (%s)",
			name, were(told[fresh[0]]), short(fresh[0]), strings.Join(shortIDs(base), ", "))
	}
	// The ledger holds more than the answers admit.
	for _, o := range ops {
		if o.Kind != LedgerRead || o.Before {
			continue
		}
		var extra []string
		for _, id := range o.Charges {
			if !slices.Contains(base, id) {
				extra = append(extra, id)
			}
		}
		switch {
		case len(extra) > 1 && len(fresh) == 1:
			return fmt.Sprintf("%s: %s told %s, but the ledger holds %s — %d charges for one key",
				name, were(told[fresh[0]]), short(fresh[0]), strings.Join(shortIDs(extra), " and "), len(extra))
		case len(extra) > 1:
			return fmt.Sprintf("%s: the ledger holds %s — %d charges for one key", name, strings.Join(shortIDs(extra), " and "), len(extra))
		case len(extra) == 1 && len(fresh) == 1 && extra[0] != fresh[0]:
			return fmt.Sprintf("%s: %s told %s, but the ledger holds %s", name, were(told[fresh[0]]), short(fresh[0]), short(extra[0]))
		}
	}
	// Another request charged, or replayed, under the key; a refusal with
	// nothing to refuse for.
	fps := map[string]int{}
	for _, o := range ops {
		if o.success() {
			if c, ok := fps[o.Fingerprint]; !ok || c > o.Client {
				fps[o.Fingerprint] = o.Client
			}
		}
	}
	if len(fps) > 1 {
		var who []int
		for _, c := range fps {
			who = append(who, c)
		}
		slices.Sort(who)
		return fmt.Sprintf("%s: %s sent different requests under the key and were all answered 2xx; one of them should have been refused with 422", name, attempts(who))
	}
	return ""
}

// were is who was told: "attempt 3 was", "attempts 1 and 4 were".
func were(cs []int) string {
	if len(cs) == 1 {
		return attempts(cs) + " was"
	}
	return attempts(cs) + " were"
}

// attempts names a set of attempts: "attempt 3", "attempts 1 and 4".
func attempts(cs []int) string {
	cs = slices.Sorted(slices.Values(cs))
	if len(cs) == 1 {
		return fmt.Sprintf("attempt %d", cs[0])
	}
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprint(c)
	}
	return "attempts " + strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// WriteHTML writes porcupine's picture of the check: each attempt a lane,
// the ledger reads one more, the linearization found (or the partial ones
// where it stops), and the run's fault events as annotations. It loads
// nothing from outside: script and style are in the page.
func (r Result) WriteHTML(w io.Writer) error {
	info := r.info
	if !r.searched {
		_, info = porcupine.CheckOperationsVerbose(model(), porcupineOps(r.h), drawSearch)
	}
	clients := 0
	for _, o := range r.h.Ops {
		clients = max(clients, o.Client)
	}
	var notes []porcupine.Annotation
	for _, e := range r.h.Events {
		client := max(e.Client-1, 0)
		if e.Client == 0 {
			client = clients // beside the ledger's lane
		}
		notes = append(notes, porcupine.Annotation{ClientId: client, Tag: "fault", Start: e.AtUS, End: e.AtUS,
			Description: e.Name, Details: e.Detail, BackgroundColor: "#f3d1cf"})
	}
	info.AddAnnotations(notes)
	if err := porcupine.Visualize(model(), info, w); err != nil {
		return fmt.Errorf("error drawing the history: %w", err)
	}
	return nil
}
