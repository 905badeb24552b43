package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
)

// concurrent fires the lab's own 64-attempt run (one key, 64 concurrent
// retries released by a barrier) AttemptRuns times on a store, and adds
// each run's wall time and barrier spread to c, whose medians then count
// every round's runs.
func (b *bencher) concurrent(ctx context.Context, st storeInfo, c *Concurrent) {
	u := b.cfg.Lab.URL + "/charge-idempotent?store=" + url.QueryEscape(string(st.Name)) + "&attempts=" + strconv.Itoa(Attempts) + "&key=fresh"
	if !st.RequiresKey {
		u = b.cfg.Lab.URL + "/charge-unsafe?attempts=" + strconv.Itoa(Attempts) + "&key=fresh"
	}
	for range b.cfg.AttemptRuns {
		rep, err := b.labRun(ctx, u)
		if err != nil {
			c.Error = err.Error()
			break
		}
		c.Runs++
		c.WallMS = append(c.WallMS, rep.WallMS)
		c.SpreadMS = append(c.SpreadMS, rep.BarrierSpreadMS)
		c.Verdicts[rep.Verdict]++
	}
	c.summarise()
}

// summarise sets the medians of the runs so far, and the store's goal.
func (c *Concurrent) summarise() {
	c.MedianWallMS, c.MedianSpreadMS = median(c.WallMS), median(c.SpreadMS)
	c.Wall, c.GoalWallMS = spreadOf(c.WallMS), wallGoalMS(c.Store)
}

// runReport is what the bench reads of a lab run's report.
type runReport struct {
	WallMS          float64 `json:"wall_ms"`
	BarrierSpreadMS float64 `json:"barrier_spread_ms"`
	Verdict         string  `json:"verdict"`
}

func (b *bencher) labRun(ctx context.Context, u string) (runReport, error) {
	var rep runReport
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return rep, fmt.Errorf("error building the run: %w", err)
	}
	if b.cfg.Lab.Token != "" {
		req.Header.Set("Authorization", "Bearer "+b.cfg.Lab.Token)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return rep, fmt.Errorf("error running %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return rep, fmt.Errorf("error reading the run's report: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return rep, fmt.Errorf("the run answered %d: %s", resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, &rep); err != nil {
		return rep, fmt.Errorf("error decoding the run's report: %w", err)
	}
	return rep, nil
}

// median of xs, 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
