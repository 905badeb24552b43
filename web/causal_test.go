package web_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants"
)

// causalProblems lists, in the result's picture as drawn, every mark drawn
// before what causes it: a replay before the key's first commit, a mark
// outside its try's bar, anything before the first release. It also counts
// the commits and the replays, so that a picture with none is no pass.
const causalProblems = `(() => {
	const svg = document.querySelector("#result svg.lanes"), out = [];
	const origin = Number(svg.querySelector("text.origin").getAttribute("x")), at = (el) => { const b = el.getBBox(); return b.x + b.width / 2; };
	const commits = [...svg.querySelectorAll("g.phase.commit")].map(at), replays = [...svg.querySelectorAll("g.phase.replay")];
	const first = Math.min(...commits);
	for (const m of replays) if (at(m) < first) out.push("a replay of lane #" + m.closest("g.lane").dataset.attempt + " at " + m.dataset.at + " ms, before the first commit");
	for (const lane of svg.querySelectorAll("g.lane")) {
		for (const m of lane.querySelectorAll("g.phase")) {
			const bars = [...lane.querySelectorAll('rect.try[data-try="' + m.dataset.try + '"]')].map(r => r.getBBox());
			const x = at(m), from = Math.min(...bars.map(b => b.x)), to = Math.max(...bars.map(b => b.x + b.width));
			if (!(x >= from - 0.01 && x <= to + 0.01)) out.push(m.classList[1] + " of lane #" + lane.dataset.attempt + " at " + m.dataset.at + " ms, outside its try's bar");
		}
	}
	for (const el of svg.querySelectorAll("g.phase, rect.try, rect.ttl, g.moment line")) {
		const x = el.tagName === "line" ? Number(el.getAttribute("x1")) : el.tagName === "rect" ? el.getBBox().x : at(el);
		if (x < origin - 0.01) out.push(el.getAttribute("class") + " drawn before the first release");
	}
	return { problems: out, commits: commits.length, replays: replays.length }; })()`

// TestPageDrawsCausesFirst fires runs on several designs from the page's
// links, a two-phase fault among them, and holds each picture, at a
// projector's width and a phone's, to causal order: no replay drawn before
// the commit it replays, no mark outside its try, nothing before the
// first release. The ledger holds one charge for each run's key.
func TestPageDrawsCausesFirst(t *testing.T) {
	t.Parallel()
	pgURL, schema := labtest.Postgres(t)
	redisURL, prefix := labtest.Redis(t)
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr, cfg.RedisPair = "127.0.0.1:0", false
	cfg.DatabaseURL, cfg.PGSchema, cfg.RedisURL, cfg.RedisPrefix = pgURL, schema, redisURL, prefix
	a := labtest.Start(t, cfg)
	ctx, problems := browser(t)
	for _, run := range []struct {
		name  string
		store lab.StoreName
		query string
	}{
		{"memory", "memory", "attempts=8"},
		{"redis", "redis", "attempts=5"},
		{"postgres", "postgres", "attempts=5"},
		{"lease-stale-worker", "lease", "attempts=3&fault=stale_worker"},
	} {
		key := "page-causal-" + run.name
		if err := chromedp.Do(ctx, chromedp.Navigate(a.URL()+"/?store="+string(run.store)+"&compare=&"+run.query+"&key="+url.QueryEscape(key)+"&fire=1")); err != nil {
			t.Fatal(err)
		}
		if _, err := chromedp.Run(ctx, poll[bool](`!!document.querySelector("#result .ledger") || !!document.querySelector("#result .error")`)); err != nil {
			t.Fatalf("%s: no run drawn: %v", run.name, err)
		}
		charges, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#result .ledger")?.dataset.charges ?? document.querySelector("#result .error").textContent`))
		if err != nil {
			t.Fatal(err)
		}
		if k, err := a.Books().KeyCharges(context.Background(), "acme", run.store, key); err != nil || k.Charges != 1 || charges != "1" {
			t.Fatalf("%s: the ledger holds %d charges for %s (%v), the page says %q: want 1", run.name, k.Charges, key, err, charges)
		}
		type drawn struct {
			Problems []string `json:"problems"`
			Commits  int      `json:"commits"`
			Replays  int      `json:"replays"`
		}
		for _, sz := range sizes() {
			resize(ctx, t, sz)
			d, err := chromedp.Run(ctx, chromedp.Evaluate[drawn](causalProblems))
			if err != nil {
				t.Fatal(err)
			}
			if d.Commits == 0 || d.Replays == 0 || len(d.Problems) > 0 {
				t.Errorf("%s at %s width: %d commits, %d replays drawn; %s", run.name, sz.name, d.Commits, d.Replays, strings.Join(d.Problems, "; "))
			}
		}
		shots(ctx, t, "causal-"+run.name)
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("the page had problems: %v", p)
	}
}
