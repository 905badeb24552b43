package bench

import (
	"slices"

	"github.com/idempotency-lab/lab/lab"
)

// Spread is one figure over the bench's rounds: its median, least and
// greatest value, and how many rounds gave one.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// spreadOf summarises xs; the zero Spread for none.
func spreadOf(xs []float64) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	s := slices.Sorted(slices.Values(xs))
	return Spread{Median: median(s), Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// Percent is the spread as ± a share of the median: half the range over
// the median, in percent. 0 for one figure.
func (s Spread) Percent() float64 {
	if s.N < 2 || s.Median <= 0 {
		return 0
	}
	return 100 * (s.Max - s.Min) / 2 / s.Median
}

// PathSummary is one path (a store, a kind, a replica count) over the
// bench's rounds: the medians and spreads of the phases that ran.
type PathSummary struct {
	Store    lab.StoreName `json:"store"`
	Kind     Kind          `json:"kind"`
	Replicas int           `json:"replicas"`
	// Rounds is how many of its phases ran; Failed how many could not.
	Rounds     int    `json:"rounds"`
	Failed     int    `json:"failed,omitempty"`
	Throughput Spread `json:"throughput_per_s"`
	P50        Spread `json:"p50_ms"`
	P99        Spread `json:"p99_ms"`
	// Ceilings are the phases' pairings over the rounds: each ratio the
	// median of the rounds' own (a phase beside the ceiling measured in its
	// round), each figure beside it the median of the rounds' figures.
	Ceilings []Pairing `json:"ceilings,omitempty"`

	phases []*Phase
}

// Path names the path as the table shows it.
func (s *PathSummary) Path() string {
	p := Phase{Store: s.Store, Kind: s.Kind, Replicas: s.Replicas}
	return p.Path()
}

// CeilingSummary is one ceiling over the bench's rounds.
type CeilingSummary struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	PerSec Spread `json:"per_s"`
	// LatencyMS is the median average latency of the rounds measured.
	LatencyMS float64 `json:"latency_avg_ms,omitempty"`
	// Status is Measured when some round measured it, else why none did.
	Status  string `json:"status"`
	Command string `json:"command,omitempty"`
}

// conclude sets every phase beside its ceilings, then sums the rounds up.
func conclude(res *Result) {
	pair(res)
	summarise(res)
}

// summarise fills the result's paths and ceiling summaries from every
// round's phases and ceilings (pair has run).
func summarise(res *Result) {
	res.Paths = nil
	for _, p := range res.ordered() {
		n := len(res.Paths)
		if n == 0 || res.Paths[n-1].Store != p.Store || res.Paths[n-1].Kind != p.Kind || res.Paths[n-1].Replicas != p.Replicas {
			res.Paths = append(res.Paths, &PathSummary{Store: p.Store, Kind: p.Kind, Replicas: p.Replicas})
		}
		s := res.Paths[len(res.Paths)-1]
		s.phases = append(s.phases, p)
	}
	for _, s := range res.Paths {
		var tput, p50, p99 []float64
		for _, p := range s.phases {
			if p.Error != "" {
				s.Failed++
				continue
			}
			s.Rounds++
			tput, p50, p99 = append(tput, p.Throughput), append(p50, p.Latency.P50), append(p99, p.Latency.P99)
		}
		s.Throughput, s.P50, s.P99 = spreadOf(tput), spreadOf(p50), spreadOf(p99)
		s.Ceilings = pairingsOverRounds(s.phases)
	}
	res.CeilingSummaries = nil
	byID := map[string]*CeilingSummary{}
	rates, latencies := map[string][]float64{}, map[string][]float64{}
	for _, c := range res.Ceilings {
		cs := byID[c.ID]
		if cs == nil {
			cs = &CeilingSummary{ID: c.ID, Name: c.Name, Status: c.Status, Command: c.Command}
			byID[c.ID] = cs
			res.CeilingSummaries = append(res.CeilingSummaries, cs)
		}
		if c.Status != Measured {
			continue
		}
		cs.Status, cs.Command = Measured, c.Command
		rates[c.ID], latencies[c.ID] = append(rates[c.ID], c.PerSec), append(latencies[c.ID], c.LatencyMS)
	}
	for _, cs := range res.CeilingSummaries {
		cs.PerSec, cs.LatencyMS = spreadOf(rates[cs.ID]), median(latencies[cs.ID])
	}
}

// pairingsOverRounds merges the phases' pairings by name, in the order
// they first appear: a ratio is the median of the rounds that have one.
func pairingsOverRounds(phases []*Phase) []Pairing {
	type acc struct {
		first         Pairing
		rates, ratios []float64
		https, stores []float64
	}
	var order []string
	byName := map[string]*acc{}
	for _, p := range phases {
		if p.Error != "" {
			continue
		}
		for _, c := range p.Ceilings {
			a := byName[c.Name]
			if a == nil {
				a = &acc{first: c}
				byName[c.Name] = a
				order = append(order, c.Name)
			}
			if c.Status != "" || c.Ratio <= 0 {
				continue
			}
			a.rates, a.ratios = append(a.rates, c.PerSec), append(a.ratios, c.Ratio)
			if c.HTTPPerSec > 0 {
				a.https, a.stores = append(a.https, c.HTTPPerSec), append(a.stores, c.StorePerSec)
			}
		}
	}
	out := make([]Pairing, 0, len(order))
	for _, name := range order {
		a := byName[name]
		q := Pairing{Name: name, Goal: a.first.Goal, Status: a.first.Status}
		if len(a.ratios) > 0 {
			rates, ratios := spreadOf(a.rates), spreadOf(a.ratios)
			q.Status, q.PerSec, q.Ratio = "", rates.Median, ratios.Median
			q.HTTPPerSec, q.StorePerSec = median(a.https), median(a.stores)
			q.Rates, q.Ratios = &rates, &ratios
		}
		out = append(out, q)
	}
	return out
}
