package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/unsafestore"
)

// browser starts headless Chromium for the test and returns a tab and the
// errors the page logs. Without Chromium the test is skipped, or fails
// under LAB_REQUIRE_SERVICES=1 (CI installs Debian's chromium).
func browser(t *testing.T) (context.Context, func() []string) {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		msg := "no Chromium installed (apt-get install chromium): this test drives the page in a real browser"
		if os.Getenv("LAB_REQUIRE_SERVICES") == "1" {
			t.Fatal(msg + "; LAB_REQUIRE_SERVICES=1 makes that a failure")
		}
		t.Skip(msg)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("no-first-run", true), chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()))
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The tab's waits end only as the test binary's deadline nears (go test
	// -timeout): a loaded machine makes a step longer, never a failure.
	if deadline, ok := t.Deadline(); ok {
		var end context.CancelFunc
		ctx, end = context.WithDeadline(ctx, deadline.Add(-time.Minute))
		t.Cleanup(end)
	}
	var mu sync.Mutex
	var problems []string
	if err := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				problems = append(problems, "console error")
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, "exception: "+ev.ExceptionDetails.Text)
		case *network.EventRequestWillBeSent:
			if u, err := url.Parse(ev.Request.URL); err == nil && u.Hostname() != "127.0.0.1" && u.Scheme != "data" {
				problems = append(problems, "request left the machine: "+ev.Request.URL)
			}
		}
	}); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(problems)
	}
}

// size is a viewport the page is checked and shot at.
type size struct {
	name          string
	width, height int64
	opts          []chromedp.EmulateViewportOption
}

// sizes are a projector's width and a phone's. The phone is not emulated
// as mobile: a mobile layout viewport widens to fit what overflows, which
// would hide the very scroll the checks look for.
func sizes() []size {
	return []size{{"desktop", 1280, 900, nil}, {"phone", 390, 844, []chromedp.EmulateViewportOption{chromedp.EmulateScale(2)}}}
}

// resize shows the page at sz, drawn again at its width as a window's
// resize draws it.
func resize(ctx context.Context, t *testing.T, sz size) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(sz.width, sz.height, sz.opts...),
		chromedp.Evaluate[chromedp.Void](`void window.dispatchEvent(new Event("resize"))`)); err != nil {
		t.Fatal(err)
	}
}

// layoutProblems lists what the page shows cut or on top of something
// else: in a run's picture, a label over another label or over a mark, or
// past the picture's edge; an input whose placeholder does not fit; a
// figure's tile that sticks out of its grid or whose text sticks out of
// the tile.
const layoutProblems = `(() => {
	const out = [], say = (el) => JSON.stringify(el.textContent.trim().slice(0, 40));
	const over = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1 && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
	for (const svg of document.querySelectorAll("svg.lanes")) {
		if (!svg.getClientRects().length) continue; // not shown
		const box = svg.getBoundingClientRect(), texts = [...svg.querySelectorAll("text")];
		// A mark's stroke reaches a pixel past its shape.
		const marks = [...svg.querySelectorAll("g.phase")].map(m => { const r = m.getBoundingClientRect();
			return { name: m.classList[1], r: { left: r.left - 1, right: r.right + 1, top: r.top - 1, bottom: r.bottom + 1 } }; });
		texts.forEach((t, i) => {
			const r = t.getBoundingClientRect();
			if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) out.push("label " + say(t) + " cut at the picture's edge");
			for (const u of texts.slice(i + 1)) if (over(r, u.getBoundingClientRect())) out.push("label " + say(t) + " over label " + say(u));
			for (const m of marks) if (over(r, m.r)) out.push("label " + say(t) + " over a " + m.name + " mark");
		});
	}
	const c = document.createElement("canvas").getContext("2d");
	for (const el of document.querySelectorAll("input[placeholder]")) {
		if (el.offsetParent === null) continue;
		const cs = getComputedStyle(el);
		c.font = cs.font;
		const room = el.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
		if (c.measureText(el.placeholder).width > room) out.push("#" + el.id + "'s placeholder " + JSON.stringify(el.placeholder) + " cut to " + Math.round(room) + " px");
	}
	for (const grid of document.querySelectorAll(".figures")) {
		if (grid.offsetParent === null) continue;
		const g = grid.getBoundingClientRect();
		for (const f of grid.children) {
			const r = f.getBoundingClientRect();
			if (r.left < g.left - 0.5 || r.right > g.right + 0.5) out.push("tile " + say(f) + " sticks out of its grid");
			if (f.scrollWidth > f.clientWidth) out.push("tile " + say(f) + ": its text sticks out of it");
		}
	}
	return out; })()`

// poll waits until expression is truthy, for as long as the tab's context
// allows: not chromedp's default of 30 s, which a loaded machine passes.
func poll[T any](expression string) chromedp.Action[T] {
	return chromedp.Poll[T](expression, chromedp.WithPollingTimeout(0))
}

// shots saves the page as it is now, at desktop and at phone width, as PNGs
// under the temp dir (lab-page-screenshots/) and logs their paths; at each
// width it holds the page to layoutProblems. At phone width the page must
// not scroll sideways: wide tables scroll in their own box.
func shots(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "lab-page-screenshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, size := range sizes() {
		resize(ctx, t, size)
		if problems, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](layoutProblems)); err != nil || len(problems) > 0 {
			t.Errorf("%s at %s width: %s (%v)", name, size.name, strings.Join(problems, "; "), err)
		}
		if size.name == "phone" {
			if w, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, window.innerWidth]`)); err != nil || len(w) != 2 || w[1] != 390 || w[0] > 390 {
				t.Errorf("%s at phone width: the page is %v wide in a %v px layout viewport, want at most 390 (%v)", name, w[0:1], w[1:], err)
			}
			// Every option of every select shown shows whole in its control
			// (a fault's parameter is hidden until its fault is chosen).
			cut, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
				const c = document.createElement("canvas").getContext("2d"), out = [];
				for (const sel of document.querySelectorAll("select")) {
					if (sel.offsetParent === null) continue;
					c.font = getComputedStyle(sel).font;
					for (const o of sel.options) if (c.measureText(o.text).width > sel.clientWidth - 30) out.push(sel.id + ": " + o.text);
				}
				return out; })()`))
			if err != nil || len(cut) > 0 {
				t.Errorf("%s at phone width: options cut short: %v (%v)", name, cut, err)
			}
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name+"-"+size.name+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
		// The result panel alone, as the README shows it at desktop width.
		if png, err = chromedp.Run(ctx, chromedp.Screenshot(chromedp.ID("result"))); err != nil {
			t.Fatal(err)
		}
		path = filepath.Join(dir, name+"-result.png")
		if size.name == "phone" {
			path = filepath.Join(dir, name+"-result-phone.png")
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
	if err := chromedp.Do(ctx, chromedp.EmulateReset()); err != nil {
		t.Fatal(err)
	}
}

// TestPageBuildsItsControlsFromTheIndex opens the page in Chromium on a lab
// with a throwaway variant registered beside the built-in ones: the store
// control lists exactly the index's variants (unavailable ones disabled),
// the fault control every fault, each fault shows only its own parameters,
// and a run on the new variant answers on the page.
func TestPageBuildsItsControlsFromTheIndex(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = append(variants.Builtin(), labtest.OneLock())
	cfg.Addr = "127.0.0.1:0"
	cfg.EmbedPostgres = false // so one store is unavailable, and must show it
	a := labtest.Start(t, cfg)
	index := labtest.Decode[api.Index](t, labtest.Do(t, http.MethodGet, a.URL()+"/", nil, ""))

	ctx, problems := browser(t)
	type option struct {
		Value    string `json:"value"`
		Disabled bool   `json:"disabled"`
	}
	read := func(sel string) []option {
		t.Helper()
		opts, err := chromedp.Run(ctx, chromedp.Evaluate[[]option](
			`[...document.querySelectorAll("`+sel+` option")].map(o => ({value: o.value, disabled: o.disabled}))`))
		if err != nil {
			t.Fatalf("reading %s: %v", sel, err)
		}
		return opts
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(a.URL()+"/")); err != nil {
		t.Fatalf("opening the page: %v", err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll("#store option").length > 0`)); err != nil {
		t.Fatalf("the store control was never filled: %v", err)
	}

	stores := read("#store")
	if len(stores) != len(index.Variants) {
		t.Fatalf("store control %+v, index %d variants", stores, len(index.Variants))
	}
	for i, v := range index.Variants {
		if stores[i].Value != string(v.Name) || stores[i].Disabled == v.Available {
			t.Errorf("option %d: %+v, index says %s (available %v)", i, stores[i], v.Name, v.Available)
		}
	}
	if last := stores[len(stores)-1]; last.Value != string(labtest.OneLockName) || last.Disabled {
		t.Errorf("the registered toy variant is %+v in the page", last)
	}

	// A matrix cell whose check ran out of time says it is not proved; a
	// proved one does not.
	for checked, want := range map[string]bool{"unknown": true, "linearizable": false} {
		html, err := chromedp.Run(ctx, chromedp.Evaluate[string](`cellHTML("retries", {available: true, store: "postgres", verdict: "holds",
			charges: 1, expected_charges: 1, explanation: "one charge", checked: "`+checked+`"})`))
		if err != nil || strings.Contains(html, "not proved") != want || strings.Contains(html, `data-checked="unknown"`) != want {
			t.Errorf("a cell checked %s: %q (%v); want it said not proved: %v", checked, html, err, want)
		}
	}

	faults := read("#fault")
	want := []string{""}
	for _, f := range lab.FaultSpecs() {
		want = append(want, string(f.Point))
	}
	if got := func() (out []string) {
		for _, o := range faults {
			out = append(out, o.Value)
		}
		return out
	}(); !slices.Equal(got, want) {
		t.Errorf("fault control %v, want %v", got, want)
	}

	for _, f := range lab.FaultSpecs() {
		shown, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
			const s = document.getElementById("fault"); s.value = "`+string(f.Point)+`";
			s.dispatchEvent(new Event("change"));
			return [...document.querySelectorAll(".param")].filter(p => !p.hidden).map(p => p.dataset.param + "=" + document.getElementById(p.dataset.param).value);
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		// Each shown parameter starts at the fault's own default.
		var want []string
		for _, p := range f.Params {
			if c := f.Choices[p]; len(c) > 0 {
				want = append(want, p+"="+c[0])
				continue
			}
			want = append(want, fmt.Sprintf("%s=%d", p, f.Defaults[p]))
		}
		if !slices.Equal(shown, want) && !(len(shown) == 0 && len(want) == 0) {
			t.Errorf("fault %s shows %v, want %v", f.Point, shown, want)
		}
	}

	// A run on the new variant, from the page.
	if err := chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("store"), string(labtest.OneLockName)),
		chromedp.SetValue(chromedp.ID("compare"), ""),
		chromedp.SetValue(chromedp.ID("fault"), ""),
		chromedp.SetValue(chromedp.ID("key"), "page-toy-1"),
		chromedp.Click(chromedp.ID("go")),
	); err != nil {
		t.Fatal(err)
	}
	verdict, err := chromedp.Run(ctx, poll[string](`document.querySelector("#result .verdict")?.textContent`))
	if err != nil {
		t.Fatalf("no verdict on the page: %v", err)
	}
	if !strings.HasPrefix(verdict, string(labtest.OneLockName)+": ") {
		t.Errorf("verdict %q, want the toy variant's run", verdict)
	}
	if k, err := a.Books().KeyCharges(context.Background(), "acme", labtest.OneLockName, "page-toy-1"); err != nil || k.Charges < 1 {
		t.Errorf("the page's run left %d charges in the ledger (%v)", k.Charges, err)
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("the page had problems: %v", p)
	}
}

// TestPageShowsTheRace: unsafe and postgres side by side with 5 attempts
// draw 5 lanes each, and the ledger figures under them (5 and 1 charges)
// are the ledger's for those runs; a redis run with a slow fault draws the
// claim's TTL ending before the first charge, and no commit: every claim
// ran out before its response was stored; an admin token in
// the token field makes Reset work. No request leaves the machine and the
// console stays clean.
func TestPageShowsTheRace(t *testing.T) {
	t.Parallel()
	url, schema := labtest.Postgres(t)
	redisURL, prefix := labtest.Redis(t)
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr = "127.0.0.1:0"
	cfg.DatabaseURL, cfg.PGSchema, cfg.RedisURL, cfg.RedisPrefix = url, schema, redisURL, prefix
	cfg.AdminToken = "admin-token-page"
	cfg.RedisPair = false
	a := labtest.Start(t, cfg)
	ctx, problems := browser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(a.URL()+"/")); err != nil {
		t.Fatalf("opening the page: %v", err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll("#compare option").length > 1`)); err != nil {
		t.Fatalf("the controls were never filled: %v", err)
	}
	fire := func(actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, append(append([]chromedp.Action[chromedp.Void]{chromedp.Evaluate[chromedp.Void](`void (document.getElementById("result").innerHTML = "")`)}, actions...),
			chromedp.Click(chromedp.ID("go")))...); err != nil {
			t.Fatal(err)
		}
	}

	fire(chromedp.SetValue(chromedp.ID("store"), "postgres"), chromedp.SetValue(chromedp.ID("compare"), "unsafe"),
		chromedp.SetValue(chromedp.ID("fault"), ""), chromedp.SetValue(chromedp.ID("attempts"), "5"), chromedp.SetValue(chromedp.ID("key"), "page-race-1"))
	if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll(".pair .run .ledger").length === 2`)); err != nil {
		t.Fatalf("no side-by-side result: %v", err)
	}
	type shown struct {
		Lanes   int    `json:"lanes"`
		Charges string `json:"charges"`
		Run     string `json:"run"`
		Rows    int    `json:"rows"` // the ledger rows listed under the lanes
		// The server's phases drawn inside the bars.
		Claims, ChargeMarks, Commits, Replays int
	}
	runs, err := chromedp.Run(ctx, chromedp.Evaluate[[]shown](`[...document.querySelectorAll(".pair .run")].map(r => ({
		lanes: r.querySelectorAll("g.lane").length, charges: r.querySelector(".ledger").dataset.charges, run: r.querySelector(".ledger").dataset.run,
		rows: r.querySelectorAll("table.rows tbody tr").length, Claims: r.querySelectorAll("g.phase.claim").length,
		ChargeMarks: r.querySelectorAll("g.phase.charge").length, Commits: r.querySelectorAll("g.phase.commit").length,
		Replays: r.querySelectorAll("g.phase.replay").length}))`))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Lanes != 5 || runs[1].Lanes != 5 || runs[0].Charges != "5" || runs[1].Charges != "1" || runs[0].Rows != 5 || runs[1].Rows != 1 {
		t.Fatalf("side by side: %+v; want 5 lanes each, 5 and 1 charges", runs)
	}
	// unsafe charges five times and stores nothing; postgres claims, charges
	// and commits once, and the four others replay what it stored.
	if u, p := runs[0], runs[1]; u.ChargeMarks != 5 || u.Claims+u.Commits+u.Replays != 0 ||
		p.Claims != 1 || p.ChargeMarks != 1 || p.Commits != 1 || p.Replays != 4 {
		t.Errorf("phase marks: unsafe %+v, postgres %+v", u, p)
	}
	shots(ctx, t, "race")
	for _, r := range runs {
		s, err := a.Books().RunStats(context.Background(), "acme", r.Run)
		if err != nil || fmt.Sprint(s.Charges) != r.Charges {
			t.Errorf("run %s: the page shows %s charges, the ledger holds %d (%v)", r.Run, r.Charges, s.Charges, err)
		}
	}

	// The outbox panel catches up with the relay, showing what GET /outbox says.
	type counts struct {
		Pending   int `json:"outbox_pending"`
		Delivered int `json:"outbox_delivered"`
		Dead      int `json:"outbox_dead"`
	}
	// The panel is the browser's, refreshed on its own timer: the test asks.
	labtest.Eventually(t, "the outbox panel showing what GET /outbox says", func() bool {
		api := labtest.Decode[counts](t, labtest.Do(t, http.MethodGet, a.URL()+"/outbox?limit=1", nil, ""))
		page, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`(() => { const d = document.querySelector("#outbox [data-pending]")?.dataset;
			return d ? [Number(d.pending), Number(d.delivered), Number(d.dead)] : [] })()`))
		return err == nil && len(page) == 3 && page[0] == api.Pending && page[1] == api.Delivered && page[2] == api.Dead && api.Delivered >= 1
	})
	// The key inspector reads the key's state from the store.
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("store"), "postgres"), chromedp.SetValue(chromedp.ID("key"), "page-race-1"),
		chromedp.Click(chromedp.ID("inspect"))); err != nil {
		t.Fatal(err)
	}
	if state, err := chromedp.Run(ctx, poll[string](`document.querySelector("#keyOut [data-state]")?.dataset.state`)); err != nil || state != lab.KeyCompleted {
		t.Fatalf("key inspector: %q %v", state, err)
	}
	// ...and shows the response it stored, as the API gives it.
	stored := labtest.Decode[struct {
		Response lab.Charge `json:"response"`
	}](t, labtest.Do(t, http.MethodGet, a.URL()+"/idempotency/state?store=postgres&key=page-race-1", nil, "")).Response
	var onPage lab.Charge
	if text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#keyOut pre.stored")?.textContent ?? ""`)); err != nil || json.Unmarshal([]byte(text), &onPage) != nil {
		t.Fatalf("no stored response in the key inspector: %q %v", text, err)
	}
	if onPage.ID == "" || onPage != stored {
		t.Errorf("key inspector shows %+v, the store holds %+v", onPage, stored)
	}
	// A bad parameter is shown next to its control, and the old result is gone.
	fire(chromedp.SetValue(chromedp.ID("compare"), ""), chromedp.SetValue(chromedp.ID("key"), strings.Repeat("k", 300)))
	if msg, err := chromedp.Run(ctx, poll[string](`document.querySelector("#key + .fielderror")?.textContent`)); err != nil || !strings.Contains(msg, "key") {
		t.Fatalf("the error beside the key: %q %v", msg, err)
	}
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#result .ledger").length`)); err != nil || n != 0 {
		t.Fatalf("an old result stayed beside the error (%d, %v)", n, err)
	}

	fire(chromedp.SetValue(chromedp.ID("store"), "redis"), chromedp.SetValue(chromedp.ID("compare"), ""),
		chromedp.SetValue(chromedp.ID("fault"), "slow"), chromedp.Evaluate[chromedp.Void](`void document.getElementById("fault").dispatchEvent(new Event("change"))`),
		chromedp.SetValue(chromedp.ID("work_ms"), "300"), chromedp.SetValue(chromedp.ID("ttl_ms"), "100"),
		chromedp.SetValue(chromedp.ID("attempts"), "3"), chromedp.SetValue(chromedp.ID("key"), "page-ttl-1"))
	if _, err := chromedp.Run(ctx, poll[bool](`!!document.querySelector("#result .ledger")`)); err != nil {
		t.Fatalf("no redis result: %v", err)
	}
	bars, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`(() => { const first = document.querySelector("#result rect.ttl");
		return [Number(first.dataset.start), Number(first.dataset.end),
		Math.min(...[...document.querySelectorAll("#result g.phase.charge")].map(g => Number(g.dataset.at))),
		Math.min(...[...document.querySelectorAll("#result g.phase.claim")].map(g => Number(g.dataset.at))),
		document.querySelectorAll("#result g.phase.commit").length] })()`))
	if err != nil {
		t.Fatal(err)
	}
	if len(bars) != 5 || bars[0] != bars[3] || math.Abs(bars[1]-bars[0]-100) > 0.01 || !(bars[1] < bars[2]) || bars[4] != 0 {
		t.Fatalf("TTL bar %v → %v, the first charge at %v, the first claim at %v, %v commits: want the bar from the claim for 100 ms, over before the charge, and no commit", bars[0], bars[1], bars[2], bars[3], bars[4])
	}
	// Nothing stored it: each claim was gone, taken over or expired, when its owner came to write.
	if k := labtest.Decode[struct {
		State string `json:"key_state"`
	}](t, labtest.Do(t, http.MethodGet, a.URL()+"/idempotency/state?store=redis&key=page-ttl-1", nil, "")); k.State != lab.KeyAbsent {
		t.Errorf("the redis key after every claim ran out: %s, want absent", k.State)
	}
	if k, err := a.Books().KeyCharges(context.Background(), "acme", "redis", "page-ttl-1"); err != nil || k.Charges != 3 {
		t.Errorf("the ledger holds %d charges for page-ttl-1 (%v): want 3, one per claim that ran out", k.Charges, err)
	}
	// The tiles show the run's own figures; a total says so, and money reads as money.
	if tiles, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`["run-cents", "total-balance"].map(n => document.querySelector("#result [data-figure=" + n + "]").textContent)`)); err != nil ||
		len(tiles) != 2 || !strings.HasPrefix(tiles[0], "$") || !strings.HasPrefix(tiles[1], "$") || !strings.Contains(tiles[1], "since the last reset") {
		t.Errorf("tiles %q (%v): want the run's charge and the balance's total, in money", tiles, err)
	}

	// A stale worker, on redis and on lease: the retries' claims are drawn
	// after the first claim's TTL or lease ran out, as they happened; on
	// lease the ledger's refusal of the paused worker's write is its own mark.
	for _, store := range []string{"redis", "lease"} {
		// A run no retry overtook (its retries came after the worker woke,
		// on a busy machine) is inconclusive and drawn so: fired again.
		for try := 1; ; try++ {
			fire(chromedp.SetValue(chromedp.ID("store"), store), chromedp.SetValue(chromedp.ID("compare"), ""),
				chromedp.SetValue(chromedp.ID("fault"), "stale_worker"), chromedp.Evaluate[chromedp.Void](`void document.getElementById("fault").dispatchEvent(new Event("change"))`),
				chromedp.SetValue(chromedp.ID("attempts"), "3"), chromedp.SetValue(chromedp.ID("key"), fmt.Sprintf("page-stale-%s-%d", store, try)))
			if _, err := chromedp.Run(ctx, poll[bool](`!!document.querySelector("#result .ledger")`)); err != nil {
				t.Fatalf("no %s stale worker result: %v", store, err)
			}
			unstaged, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!!document.querySelector("#result .verdict.inconclusive")`))
			if err != nil {
				t.Fatal(err)
			}
			if !unstaged || try == 3 {
				break
			}
			t.Logf("%s stale worker run %d was inconclusive: firing it again", store, try)
		}
		type stale struct {
			TTLEnd        float64   `json:"ttlEnd"`
			RetryClaims   []float64 `json:"retryClaims"`
			Fenced        int       `json:"fenced"`
			FenceLabel    string    `json:"fenceLabel"`
			RetryReleased float64   `json:"released"`
		}
		got, err := chromedp.Run(ctx, chromedp.Evaluate[stale](`(() => {
			const bar = document.querySelector('#result rect.ttl[data-attempt="1"]');
			const claims = [...document.querySelectorAll('#result g.lane:not([data-attempt="1"]) g.phase.claim')].map(g => Number(g.dataset.at));
			const moment = document.querySelector('#result g.moment[data-name="retries_released"]');
			return {ttlEnd: bar ? Number(bar.dataset.end) : -1, retryClaims: claims,
				fenced: document.querySelectorAll('#result g.lane[data-attempt="1"] g.phase.fenced').length,
				fenceLabel: document.querySelector("#result text.fencelabel")?.textContent ?? "",
				released: moment ? Number(moment.dataset.at) : -1}; })()`))
		if err != nil {
			t.Fatal(err)
		}
		if got.TTLEnd <= 0 || len(got.RetryClaims) == 0 || got.RetryReleased < got.TTLEnd {
			t.Fatalf("%s: %+v: want the first claim's bar, a retry's claim, and the retries released after the bar's end", store, got)
		}
		for _, c := range got.RetryClaims {
			if c < got.TTLEnd {
				t.Errorf("%s: a retry's claim is drawn at %.1f ms, inside the first claim's TTL (ends %.1f ms)", store, c, got.TTLEnd)
			}
		}
		switch {
		case store == "lease" && (got.Fenced != 1 || !strings.HasPrefix(got.FenceLabel, "write refused: token ")):
			t.Errorf("lease: %d fenced marks, label %q: want the refused write drawn and labelled", got.Fenced, got.FenceLabel)
		case store == "redis" && got.Fenced != 0:
			t.Errorf("redis has no fence, yet %d fenced marks", got.Fenced)
		}
		shots(ctx, t, "stale-worker-"+store)
	}
	// Every run of the session can be opened again: the side-by-side one.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#history li:last-child button`))); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll(".pair .run g.lane").length === 10 &&
		document.querySelectorAll(".pair .run rect.ttl").length === 0`)); err != nil {
		t.Fatalf("reopening the first run: %v", err)
	}

	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("token"), "admin-token-page"),
		chromedp.Evaluate[chromedp.Void](`void document.getElementById("token").dispatchEvent(new Event("change"))`),
		chromedp.Click(chromedp.ID("reset"))); err != nil {
		t.Fatal(err)
	}
	text, err := chromedp.Run(ctx, poll[string](`document.querySelector("#result p")?.textContent.startsWith("Reset") && document.querySelector("#result p").textContent`))
	if err != nil || !strings.HasPrefix(text, "Reset") {
		t.Fatalf("reset with the admin token: %q %v", text, err)
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("the page had problems: %v", p)
	}
}

// TestPageDrawsTheMatrix clicks the breakage matrix on a lab of the two
// designs that need no service (every cell of every design is the same
// page code; TestMatrix holds the verdicts): its progress while it runs,
// every cell's verdict and reason as the API gives them, a step button for
// every cell with a schedule, and a cell that opens its run.
func TestPageDrawsTheMatrix(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = []variant.Variant{unsafestore.Variant(), memory.Variant()}
	cfg.Addr, cfg.RedisPair, cfg.EmbedPostgres, cfg.EmbedRedis = "127.0.0.1:0", false, false, false
	a := labtest.Start(t, cfg)
	ctx, problems := browser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(a.URL()+"/")); err != nil {
		t.Fatalf("opening the page: %v", err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll("#store option").length > 1`)); err != nil {
		t.Fatalf("the controls were never filled: %v", err)
	}
	// Every cell's verdict and count as the API gives them, its
	// reason written out, and a cell that opens its run.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("matrix"))); err != nil {
		t.Fatal(err)
	}
	// Progress while it runs: some cells decided, some still pending.
	if _, err := chromedp.Run(ctx, poll[bool](`(() => { const p = document.querySelector("#matrixProgress progress");
		return !!p && p.value > 0 && p.value < p.max && document.querySelectorAll("#matrixOut td[data-pending]").length === p.max - p.value &&
			document.querySelector("#matrixProgress span").textContent === p.value + " of " + p.max + " cells" })()`)); err != nil {
		t.Fatalf("no progress while the matrix ran: %v", err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`/real runs in/.test(document.querySelector("#matrixProgress")?.textContent)`)); err != nil {
		t.Fatalf("the matrix never finished on the page: %v", err)
	}
	type cell struct {
		Case    string `json:"case"`
		Store   string `json:"store"`
		Verdict string `json:"verdict"`
		Why     string `json:"why"`
	}
	cells, err := chromedp.Run(ctx, chromedp.Evaluate[[]cell](`[...document.querySelectorAll("#matrixOut td[data-case]")].map(td => ({
		case: td.dataset.case, store: td.dataset.store, verdict: td.className, why: td.querySelector(".cellwhy").textContent}))`))
	if err != nil {
		t.Fatal(err)
	}
	m := labtest.Decode[struct {
		Rows []struct {
			Case struct {
				Name string `json:"name"`
			} `json:"case"`
			Cells []struct {
				Store       string `json:"store"`
				Available   bool   `json:"available"`
				Verdict     string `json:"verdict"`
				Explanation string `json:"explanation"`
				Schedule    string `json:"schedule"`
			} `json:"cells"`
		} `json:"rows"`
	}](t, labtest.Do(t, http.MethodGet, a.URL()+"/lab/matrix", nil, ""))
	want, why, schedules := map[string]string{}, map[string]string{}, 0
	for _, row := range m.Rows {
		for _, c := range row.Cells {
			if c.Available {
				want[row.Case.Name+"/"+c.Store] = c.Verdict
				why[row.Case.Name+"/"+c.Store] = c.Explanation
			}
			if c.Available && c.Schedule != "" {
				schedules++
			}
		}
	}
	// Each cell with a named schedule offers to step it.
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#matrixOut td[data-case] button[data-schedule]").length`)); err != nil || n != schedules || n == 0 {
		t.Errorf("the matrix offers %d cells to step, the API names %d schedules (%v)", n, schedules, err)
	}
	if len(cells) != len(want) {
		t.Fatalf("the page shows %d cells, the API %d", len(cells), len(want))
	}
	for _, c := range cells {
		if w := want[c.Case+"/"+c.Store]; c.Verdict != w || c.Why == "" {
			t.Errorf("cell %s/%s: %s (%q), the API says %s", c.Case, c.Store, c.Verdict, c.Why, w)
		}
		// The reason is written from the run's evidence: the same outcome
		// gives the same words.
		if w := why[c.Case+"/"+c.Store]; c.Why != w {
			t.Errorf("cell %s/%s reads %q, the API's run %q", c.Case, c.Store, c.Why, w)
		}
	}
	// The cell itself opens its run (its "step it" button, the stepper).
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`void document.querySelector('#matrixOut td[data-case="replicas"][data-store="memory"]').click()`)); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll("#result g.lane").length === 9 &&
		new Set([...document.querySelectorAll("#result g.lane")].map(g => g.dataset.replica)).size === 3`)); err != nil {
		t.Fatalf("the replicas cell did not open its 9 lanes over 3 replicas: %v", err)
	}

	shots(ctx, t, "matrix")
	if p := problems(); len(p) > 0 {
		t.Errorf("the page had problems: %v", p)
	}
}

// TestPageBehindABasePathWithoutFaults: behind /16 and with faults off, a
// plain run from the page works (no 403), the fault control only offers
// none, and the matrix (which injects faults) is offered disabled, saying why.
func TestPageBehindABasePathWithoutFaults(t *testing.T) {
	t.Parallel()
	url, schema := labtest.Postgres(t)
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr, cfg.BasePath, cfg.FaultsEnabled = "127.0.0.1:0", "/16", false
	cfg.DatabaseURL, cfg.PGSchema, cfg.RedisPair = url, schema, false
	a := labtest.Start(t, cfg)
	ctx, problems := browser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(a.URL()+"/")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll("#store option").length > 0`)); err != nil {
		t.Fatal(err)
	}
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#fault option").length`)); err != nil || n != 1 {
		t.Fatalf("faults off: %d fault options (%v), want none but \"none\"", n, err)
	}
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("store"), "postgres"), chromedp.SetValue(chromedp.ID("compare"), "unsafe"),
		chromedp.SetValue(chromedp.ID("key"), "page-base-1"), chromedp.Click(chromedp.ID("go"))); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll(".pair .run .ledger").length === 2 || !!document.querySelector("#result .error")`)); err != nil {
		t.Fatal(err)
	}
	if msg, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#result .error")?.textContent ?? ""`)); msg != "" {
		t.Fatalf("a plain run with faults off: %s", msg)
	}
	if off, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("matrix").disabled ? document.getElementById("matrixOut").textContent : ""`)); err != nil || !strings.Contains(off, "faults") {
		t.Errorf("with faults off the matrix button should be disabled, saying why: %q %v", off, err)
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("the page had problems: %v", p)
	}
}

// TestPageFirstPicture: a link opens the page with a run fired, and each
// press of Fire with the key left blank uses a new key, so the picture is
// five charges against one even after the walkthrough charged its key
// (order-4711) on both designs. A link is read as strictly as a run.
func TestPageFirstPicture(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr, cfg.EmbedPostgres, cfg.RedisPair = "127.0.0.1:0", false, false
	a := labtest.Start(t, cfg)
	for _, path := range []string{"/charge-unsafe?attempts=5&key=order-4711", "/charge-idempotent?store=memory&attempts=5&key=order-4711"} {
		if r := labtest.Do(t, http.MethodGet, a.URL()+path, nil, ""); r.Status != http.StatusOK {
			t.Fatalf("the walkthrough's %s: %d %s", path, r.Status, r.Body)
		}
	}
	html := http.Header{"Accept": {"text/html"}}
	for query, param := range map[string]string{"store=memory&attempts=0&fire=1": "attempts", "store=nope&fire=1": "store",
		"fire=yes": "fire", "compare=nope": "compare", "store=memory&work_ms=300": "work_ms", "account=acct-2": "account"} {
		labtest.WantProblem(t, "the link /?"+query, labtest.Do(t, http.MethodGet, a.URL()+"/?"+query, html, ""), http.StatusBadRequest, "invalid_parameter", param)
	}

	// Every link docs/page.md lists opens the page.
	doc, err := os.ReadFile("../docs/page.md")
	if err != nil {
		t.Fatal(err)
	}
	links := regexp.MustCompile("(?m)^\\| `(/\\?[^`]+)`").FindAllStringSubmatch(string(doc), -1)
	if len(links) < 3 {
		t.Fatalf("docs/page.md lists %d links that fire a run", len(links))
	}
	for _, l := range links {
		if r := labtest.Do(t, http.MethodGet, a.URL()+l[1], html, ""); r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/html") {
			t.Errorf("docs/page.md's link %s: %d %.200s", l[1], r.Status, r.Body)
		}
	}

	ctx, problems := browser(t)
	type picture struct {
		Stores  []string `json:"stores"`
		Charges []string `json:"charges"`
		Keys    []string `json:"keys"`
	}
	// shown waits for the side-by-side result and reads it.
	shown := func(what string) picture {
		t.Helper()
		if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll(".pair .run .ledger").length === 2`)); err != nil {
			t.Fatalf("%s: no side-by-side result: %v", what, err)
		}
		p, err := chromedp.Run(ctx, chromedp.Evaluate[picture](`(() => { const runs = [...document.querySelectorAll(".pair .run")];
			return { stores: runs.map(r => r.querySelector(".verdict").textContent.split(":")[0]), charges: runs.map(r => r.querySelector(".ledger").dataset.charges),
				keys: runs.map(r => r.querySelector("[data-key]").textContent) } })()`))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p.Stores, []string{"unsafe", "memory"}) || !slices.Equal(p.Charges, []string{"5", "1"}) || p.Keys[0] != p.Keys[1] || p.Keys[0] == "order-4711" {
			t.Fatalf("%s: %+v; want unsafe 5 charges against memory 1, both on one new key", what, p)
		}
		return p
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(a.URL()+"/?store=memory&attempts=5&fire=1")); err != nil {
		t.Fatalf("opening the link: %v", err)
	}
	first := shown("the link's run, fired on load")
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`void (document.getElementById("result").innerHTML = "")`), chromedp.Click(chromedp.ID("go"))); err != nil {
		t.Fatal(err)
	}
	if again := shown("a second press"); again.Keys[0] == first.Keys[0] {
		t.Errorf("the second press reused the key %s", again.Keys[0])
	}
	// The panel says why the provider's captures outnumber the outbox's
	// deliveries, and the balance since when it counts.
	if text, err := chromedp.Run(ctx, poll[string](`document.querySelector("#outbox [data-direct]")?.textContent`)); err != nil || !strings.Contains(text, "unsafe") {
		t.Errorf("the outbox panel does not say the provider also counts unsafe's direct calls: %q %v", text, err)
	}
	if label, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("[data-figure=total-balance] span").textContent`)); err != nil || !strings.Contains(label, "since the last reset") {
		t.Errorf("the balance tile %q (%v) does not say since when", label, err)
	}
	shots(ctx, t, "first-picture")
	if p := problems(); len(p) > 0 {
		t.Errorf("the page logged: %v", p)
	}
}
