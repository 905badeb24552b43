package history

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// state is one key as the model sees it after some operations.
type state struct {
	base    string // the charges the key held before the run, sorted, joined by ','
	runID   string // the one charge applied during the run, when its id is known
	applied bool   // a charge was applied during the run (runID may be unknown: an answer never came)
	fp      string // the fingerprint of the key's charge, "" when unknown
}

func (s state) baseIDs() []string {
	if s.base == "" {
		return nil
	}
	return strings.Split(s.base, ",")
}

func (s state) charged() bool { return s.base != "" || s.applied }

// model is the porcupine model of "charge once per key".
func model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
			var order []Key
			byKey := map[Key][]porcupine.Operation{}
			for _, o := range ops {
				k := o.Input.(Op).Key
				if _, seen := byKey[k]; !seen {
					order = append(order, k)
				}
				byKey[k] = append(byKey[k], o)
			}
			out := make([][]porcupine.Operation, 0, len(order))
			for _, k := range order {
				out = append(out, byKey[k])
			}
			return out
		},
		Init: func() []any { return []any{state{}} },
		Step: func(st, in, _ any) []any {
			next := step(st.(state), in.(Op))
			out := make([]any, len(next))
			for i, s := range next {
				out[i] = s
			}
			return out
		},
		DescribeOperation: func(in, _ any) string { return describe(in.(Op)) },
		DescribeState: func(st any) string {
			s := st.(state)
			switch {
			case !s.charged():
				return "not charged"
			case s.applied && s.runID == "":
				return "charged during the run (its id unknown)"
			case s.applied:
				return "charged during the run: " + s.runID
			}
			return "charged before the run: " + strings.ReplaceAll(s.base, ",", ", ")
		},
	}
	return nm.ToModel()
}

// step is every state the key may be in after o, none when o's answer is
// impossible in s.
func step(s state, o Op) []state {
	if o.Kind == LedgerRead {
		return read(s, o)
	}
	switch {
	case o.Unknown():
		// May have applied, or not.
		out := []state{s}
		if !s.charged() {
			out = append(out, state{applied: true, fp: o.Fingerprint})
		}
		return out
	case o.Status >= 200 && o.Status < 300:
		return success(s, o)
	case o.Status == http.StatusUnprocessableEntity:
		// Refused for another request under the key: only once the key
		// holds a charge of another fingerprint (or one whose fingerprint
		// the run never saw).
		if s.charged() && (s.fp == "" || s.fp != o.Fingerprint) {
			return []state{s}
		}
		return nil
	}
	return []state{s} // a 409 or another refusal applies nothing
}

// success is a 2xx answer carrying the key's charge.
func success(s state, o Op) []state {
	if !s.charged() {
		return []state{{applied: true, runID: o.ChargeID, fp: o.Fingerprint}}
	}
	if s.fp != "" && s.fp != o.Fingerprint {
		return nil // charged, or replayed, for another request under the key
	}
	if s.fp == "" {
		s.fp = o.Fingerprint
	}
	switch {
	case o.ChargeID == "" || o.ChargeID == s.runID:
	case slices.Contains(s.baseIDs(), o.ChargeID):
	case s.applied && s.runID == "":
		s.runID = o.ChargeID // the charge whose answer never came: now its id is known
	default:
		return nil // another charge than the key's one
	}
	return []state{s}
}

// read is a ledger read: the charges it saw must be exactly the key's.
func read(s state, o Op) []state {
	got := slices.Sorted(slices.Values(o.Charges))
	if o.Before {
		if s != (state{}) {
			return nil // a read "before" the run after some of it
		}
		return []state{{base: strings.Join(got, ",")}}
	}
	base := s.baseIDs()
	want := slices.Clone(base)
	switch {
	case s.applied && s.runID != "":
		want = append(want, s.runID)
	case s.applied:
		// One charge of unknown id: the read must hold the base and one more.
		if len(got) != len(base)+1 || !subset(base, got) {
			return nil
		}
		for _, id := range got {
			if !slices.Contains(base, id) {
				s.runID = id
			}
		}
		return []state{s}
	}
	if !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		return nil
	}
	return []state{s}
}

func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// describe says what an operation was, as the picture labels it.
func describe(o Op) string {
	if o.Kind == LedgerRead {
		who := "ledger read"
		if o.Before {
			who = "ledger read before the run"
		}
		if len(o.Charges) == 0 {
			return who + ": no charge"
		}
		return fmt.Sprintf("%s: %s", who, strings.Join(shortIDs(o.Charges), ", "))
	}
	var told string
	switch {
	case o.Status == 0:
		told = "no answer"
	case o.ChargeID != "" && o.Replayed:
		told = fmt.Sprintf("%d %s (replay)", o.Status, short(o.ChargeID))
	case o.ChargeID != "":
		told = fmt.Sprintf("%d %s", o.Status, short(o.ChargeID))
	case o.Code != "":
		told = fmt.Sprintf("%d %s", o.Status, o.Code)
	default:
		told = fmt.Sprint(o.Status)
	}
	return fmt.Sprintf("attempt %d: %s", o.Client, told)
}

// short is a charge id cut to what tells two apart at a glance.
func short(id string) string {
	if len(id) > 11 {
		return id[:11] + "…"
	}
	return id
}

func shortIDs(ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = short(id)
	}
	return out
}
