package web_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/step"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants"
)

// stepView is a stepped run as GET /lab/step/{id} answers it.
type stepView struct {
	step.View
	Ledger struct {
		Charges int `json:"charges"`
	} `json:"ledger"`
	Error string `json:"error"`
}

// laneCell is one cell of a lane as the page draws it.
type laneCell struct {
	Move     int    `json:"move"`
	State    string `json:"state"`
	Point    string `json:"point"`
	Status   int    `json:"status"`
	Replayed bool   `json:"replayed"`
	Text     string `json:"text"`
	Title    string `json:"title"`
}

// lane is one attempt's lane as the page draws it.
type lane struct {
	Attempt int        `json:"attempt"`
	Cells   []laneCell `json:"cells"`
}

// stepper drives the page's stepper panel on one lab.
type stepper struct {
	t    *testing.T
	ctx  context.Context // the tab
	base string
}

// open opens the page, then the named schedule without playing it, and
// returns the run the page shows.
func (s stepper) open(schedule string) stepView {
	s.t.Helper()
	if err := chromedp.Do(s.ctx, chromedp.Navigate(s.base+"/")); err != nil {
		s.t.Fatalf("opening the page: %v", err)
	}
	if _, err := chromedp.Run(s.ctx, poll[bool](`[...document.querySelectorAll("#stepSchedule option")].some(o => o.value === "`+schedule+`" && !o.disabled)`)); err != nil {
		s.t.Fatalf("the schedule control never offered %s: %v", schedule, err)
	}
	if err := chromedp.Do(s.ctx, chromedp.SetValue(chromedp.ID("stepSchedule"), schedule), chromedp.Click(chromedp.ID("stepOpen"))); err != nil {
		s.t.Fatal(err)
	}
	id, err := chromedp.Run(s.ctx, poll[string](`document.getElementById("stepper").dataset.run`))
	if err != nil {
		s.t.Fatalf("the page opened no stepped run: %v", err)
	}
	v := s.view(id)
	if v.Schedule != schedule || len(v.Moves) != 0 || len(v.Planned) == 0 {
		s.t.Fatalf("opened %s: the server has %+v", schedule, v.View)
	}
	s.check(v)
	return v
}

// view is the run as the server has it now.
func (s stepper) view(id string) stepView {
	s.t.Helper()
	r := labtest.Do(s.t, http.MethodGet, s.base+"/lab/step/"+id, nil, "")
	if r.Status != http.StatusOK {
		s.t.Fatalf("GET /lab/step/%s: %d %s", id, r.Status, r.Body)
	}
	return labtest.Decode[stepView](s.t, r)
}

// idle waits until the page shows n moves of run id and no move is in
// flight, and returns the run as the server has it.
func (s stepper) idle(id string, n int) stepView {
	s.t.Helper()
	if _, err := chromedp.Run(s.ctx, poll[bool](fmt.Sprintf(`(() => { const d = document.getElementById("stepper").dataset;
		return d.run === %q && d.moves === "%d" && !d.busy; })()`, id, n))); err != nil {
		msg, _ := chromedp.Run(s.ctx, chromedp.Evaluate[string](`document.getElementById("stepMsg").textContent`))
		s.t.Fatalf("the page never showed move %d of %s (%q): %v", n, id, msg, err)
	}
	return s.view(id)
}

// next clicks next and returns the run once the page shows the move.
func (s stepper) next(v stepView) stepView {
	s.t.Helper()
	got := s.click(v, "#stepNext")
	if n := len(got.Moves); got.Steps[n-1] != got.Planned[n-1] {
		s.t.Fatalf("next: want move %d to be %s, the server made %v", n, got.Planned[n-1], got.Steps)
	}
	return got
}

// click clicks the button sel, which makes one move, and returns the run
// once the page shows it, its lanes checked.
func (s stepper) click(v stepView, sel string) stepView {
	s.t.Helper()
	n := len(v.Moves) + 1
	if err := chromedp.Do(s.ctx, chromedp.Click(chromedp.CSS(sel))); err != nil {
		s.t.Fatal(err)
	}
	got := s.idle(v.ID, n)
	if len(got.Moves) != n || got.Error != "" {
		s.t.Fatalf("%s: want move %d, the server made %v (%s)", sel, n, got.Steps, got.Error)
	}
	s.check(got)
	return got
}

// lanes reads the lanes as the page draws them.
func (s stepper) lanes() []lane {
	s.t.Helper()
	ls, err := chromedp.Run(s.ctx, chromedp.Evaluate[[]lane](`[...document.querySelectorAll("#stepLanes [data-lane]")].map(l => ({
		attempt: Number(l.dataset.lane),
		cells: [...l.querySelectorAll("[data-move]")].map(c => ({ move: Number(c.dataset.move), state: c.dataset.state, point: c.dataset.point,
			status: Number(c.dataset.status || 0), replayed: c.dataset.replayed === "true", text: c.textContent, title: c.title })) }))`))
	if err != nil {
		s.t.Fatal(err)
	}
	return ls
}

// check holds the lanes to the server's run: a lane per attempt, a column
// per move, each cell where the move record says the attempt stood, and
// each lane's last cell saying what the attempt's view says.
func (s stepper) check(v stepView) {
	s.t.Helper()
	ls := s.lanes()
	if len(ls) != len(v.Attempts) {
		s.t.Fatalf("after %d moves: %d lanes, the run has %d attempts", len(v.Moves), len(ls), len(v.Attempts))
	}
	if heads, err := chromedp.Run(s.ctx, chromedp.Evaluate[int](`document.querySelectorAll("#stepLanes [data-head]").length`)); err != nil || heads != len(v.Moves) {
		s.t.Fatalf("after %d moves: %d column heads (%v)", len(v.Moves), heads, err)
	}
	for i, l := range ls {
		a := v.Attempts[i]
		if l.Attempt != a.Attempt || len(l.Cells) != len(v.Moves) {
			s.t.Fatalf("after %d moves: lane %d (attempt %d) has %d columns, want %d", len(v.Moves), i+1, l.Attempt, len(l.Cells), len(v.Moves))
		}
		for k, c := range l.Cells {
			st := v.Moves[k].Attempts[i]
			if c.Move != k+1 || c.State != string(st.State) || c.Point != string(st.Point) || c.Status != st.Status {
				s.t.Errorf("attempt %d, move %d: the page shows %+v, the run recorded %+v", a.Attempt, k+1, c, st)
			}
		}
		if len(l.Cells) == 0 {
			continue
		}
		last := l.Cells[len(l.Cells)-1]
		if last.State != string(a.State) || last.Point != string(a.Point) {
			s.t.Errorf("attempt %d after move %d: the last cell is %s at %q, the attempt is %s at %q", a.Attempt, len(v.Moves), last.State, last.Point, a.State, a.Point)
		}
		switch a.State {
		case step.StatePaused:
			if last.Text != string(a.Point) {
				s.t.Errorf("attempt %d paused at %s: its cell reads %q", a.Attempt, a.Point, last.Text)
			}
		case step.StateBlocked:
			if last.Text != "blocked" || !strings.Contains(last.Title, a.Blocked) {
				s.t.Errorf("attempt %d blocked on %q: its cell reads %q titled %q", a.Attempt, a.Blocked, last.Text, last.Title)
			}
		case step.StateAnswered:
			ans := a.Answer
			if ans == nil || last.Status != ans.Status || !strings.HasPrefix(last.Text, strconv.Itoa(ans.Status)) ||
				strings.Contains(last.Text, "replay") != ans.Replayed || last.Replayed != ans.Replayed {
				s.t.Errorf("attempt %d answered %+v: its cell reads %q (%+v)", a.Attempt, ans, last.Text, last)
			}
		}
	}
}

// finished checks the end of a run on the page: the ledger's charges as
// the books hold them for the key, the verdict and its history link.
func (s stepper) finished(a *app.App, v stepView, charges int, checked string) {
	s.t.Helper()
	if !v.Over || v.Verdict == nil || v.Checked != checked {
		s.t.Fatalf("the run is not over as wanted: over %v, verdict %+v, want %s", v.Over, v.Verdict, checked)
	}
	k, err := a.Books().KeyCharges(context.Background(), "acme", v.Store, v.Key)
	if err != nil || k.Charges != charges || v.Ledger.Charges != charges {
		s.t.Fatalf("the books hold %d charges for %s, the run's ledger %d (%v); want %d", k.Charges, v.Key, v.Ledger.Charges, err, charges)
	}
	type shown struct {
		Charges string `json:"charges"`
		Checked string `json:"checked"`
		Text    string `json:"text"`
		Href    string `json:"href"`
		Moves   string `json:"moves"`
		Next    bool   `json:"next"` // next is disabled
	}
	got, err := chromedp.Run(s.ctx, chromedp.Evaluate[shown](`(() => { const p = document.getElementById("stepChecked");
		return { charges: document.getElementById("stepLedger").dataset.charges, checked: p?.dataset.checked ?? "", text: p?.textContent ?? "",
			href: p?.querySelector("a.history")?.href ?? "", moves: document.getElementById("stepMoves").textContent,
			next: !document.getElementById("stepNext") || document.getElementById("stepNext").disabled }; })()`))
	if err != nil {
		s.t.Fatal(err)
	}
	if got.Charges != strconv.Itoa(charges) || got.Checked != checked || !strings.Contains(got.Text, v.CheckedWhy) ||
		!strings.HasSuffix(got.Href, "/lab/runs/"+v.RunID+"/history.html") || got.Moves != step.FormatMoves(v.Steps) || !got.Next {
		s.t.Fatalf("the end of %s on the page: %+v; want %d charges, %s (%s), its history and the moves %s", v.ID, got, charges, checked, v.CheckedWhy, step.FormatMoves(v.Steps))
	}
	if r := labtest.Do(s.t, http.MethodGet, got.Href, nil, ""); r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/html") {
		s.t.Fatalf("the verdict's history link: %d %s", r.Status, r.Header.Get("Content-Type"))
	}
}

// panelShots saves the stepper panel alone, at desktop and at phone width,
// beside the whole page's shots.
func panelShots(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	shots(ctx, t, name)
	dir := filepath.Join(os.TempDir(), "lab-page-screenshots")
	for _, size := range sizes() {
		resize(ctx, t, size)
		// The lanes scroll in their own box; the panel never wider than the page.
		if w, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`[document.getElementById("stepper").scrollWidth, document.getElementById("stepper").clientWidth]`)); err != nil || w[0] > w[1] {
			t.Errorf("%s at %s width: the stepper panel is %v wide inside %v (%v)", name, size.name, w[0:1], w[1:], err)
		}
		png, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.ID("stepper")))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name+"-panel-"+size.name+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
	if err := chromedp.Do(ctx, chromedp.EmulateReset()); err != nil {
		t.Fatal(err)
	}
}

// TestStepperStepsASchedule opens look-first-both-look on the page and plays
// it with next, one move at a time: after every move the lanes are the
// server's run, a column per move. Both attempts look before either
// writes, so the ledger holds 2 charges for the key and the verdict says
// so; replaying the exported moves on a new run gives the same. Advanced
// by hand in another order, it says what that play left instead, and why
// next and play are grey.
func TestStepperStepsASchedule(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr, cfg.RedisPair, cfg.EmbedPostgres = "127.0.0.1:0", false, false
	a := labtest.Start(t, cfg)
	ctx, problems := browser(t)
	s := stepper{t: t, ctx: ctx, base: a.URL()}

	v := s.open("look-first-both-look")
	for range v.Planned {
		v = s.next(v)
	}
	s.finished(a, v, 2, "violation")
	if text := s.verdict(); !strings.Contains(text, "leaves 2 charge(s) every time it is played") {
		t.Errorf("the schedule played as named: %q, want what it leaves every time", text)
	}
	panelShots(ctx, t, "stepper")

	// The export, replayed: a new custom run of the same shape, the same
	// moves as one schedule, the same two charges.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("stepReplay"))); err != nil {
		t.Fatal(err)
	}
	id, err := chromedp.Run(ctx, poll[string](fmt.Sprintf(`(() => { const d = document.getElementById("stepper").dataset;
		return d.run !== %q && d.moves === "%d" && !d.busy && d.run; })()`, v.ID, len(v.Steps))))
	if err != nil {
		t.Fatalf("the replay never showed its moves: %v", err)
	}
	r := s.view(id)
	if r.Schedule != "" || r.Store != v.Store || step.FormatMoves(r.Steps) != step.FormatMoves(v.Steps) {
		t.Fatalf("the replay made %v on %s (schedule %q), want %v on %s", r.Steps, r.Store, r.Schedule, v.Steps, v.Store)
	}
	s.check(r)
	s.finished(a, r, 2, "violation")

	// The schedule advanced by hand in another order, 1,1,1,1,2,2: from the
	// second move on, the moves are the schedule's no longer, so next and
	// play are grey and say why, and the end says what this play left
	// (attempt 2 looked after attempt 1 wrote: 1 charge), not what the
	// schedule leaves.
	v = s.open("look-first-both-look")
	for i, attempt := range []int{1, 1, 1, 1, 2, 2} {
		v = s.click(v, fmt.Sprintf(`#stepBar button[data-advance="%d"]`, attempt))
		if i != 1 {
			continue
		}
		type grey struct {
			Next, Play, Shown bool
			Why               string
		}
		g, err := chromedp.Run(ctx, chromedp.Evaluate[grey](`(() => { const why = document.getElementById("stepWhy");
			return { Next: document.getElementById("stepNext").disabled, Play: document.getElementById("stepPlay").disabled,
				Shown: why.getClientRects().length > 0, Why: why.textContent }; })()`))
		if err != nil || !g.Next || !g.Play || !g.Shown || !strings.Contains(g.Why, "left the schedule") {
			t.Errorf("after moves %v, off the schedule %v: %+v (%v); want next and play grey, saying why", v.Steps, v.Planned, g, err)
		}
		panelShots(ctx, t, "stepper-off-schedule")
	}
	s.finished(a, v, 1, "linearizable")
	if text := s.verdict(); strings.Contains(text, "every time") || !strings.Contains(text, "left the schedule") || !strings.Contains(text, "left 1 charge(s)") {
		t.Errorf("after moves %v, off the schedule %v: %q; want what this play left, 1 charge", v.Steps, v.Planned, text)
	}
	panelShots(ctx, t, "stepper-by-hand")
	if p := problems(); len(p) > 0 {
		t.Errorf("the page had problems: %v", p)
	}
}

// verdict is the end of the run as the page words it.
func (s stepper) verdict() string {
	s.t.Helper()
	text, err := chromedp.Run(s.ctx, chromedp.Evaluate[string](`document.getElementById("stepVerdict").textContent`))
	if err != nil {
		s.t.Fatal(err)
	}
	return text
}

// TestStepperShowsTheBlock steps postgres-both-claim: after move 4 attempt
// 2's lane reads "blocked", on what attempt 1 holds; play, paused and
// played again, finishes the schedule by itself and stops at its end, where
// attempt 2 replays attempt 1's charge: one charge.
func TestStepperShowsTheBlock(t *testing.T) {
	t.Parallel()
	url, schema := labtest.Postgres(t)
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr = "127.0.0.1:0"
	cfg.DatabaseURL, cfg.PGSchema, cfg.RedisPair = url, schema, false
	a := labtest.Start(t, cfg)
	ctx, problems := browser(t)
	s := stepper{t: t, ctx: ctx, base: a.URL()}

	v := s.open("postgres-both-claim")
	for range 4 {
		v = s.next(v)
	}
	blocked := s.lanes()[1].Cells[3]
	if blocked.Text != "blocked" || !strings.Contains(blocked.Title, "attempt 1") || v.Attempts[0].Point != lab.PointAfterClaim {
		t.Fatalf("after move 4: attempt 2's cell %+v, attempt 1 at %s; want attempt 2 blocked on attempt 1, paused after its claim", blocked, v.Attempts[0].Point)
	}
	shots(ctx, t, "stepper-blocked")

	// Play, then pause as soon as it has made a move: it makes no more.
	play := func() {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("stepPlay"))); err != nil {
			t.Fatal(err)
		}
	}
	play()
	if _, err := chromedp.Run(ctx, poll[bool](`Number(document.getElementById("stepper").dataset.moves) >= 5`)); err != nil {
		t.Fatalf("play made no move: %v", err)
	}
	play() // now pause
	if _, err := chromedp.Run(ctx, poll[bool](`document.getElementById("stepPlay").textContent === "play" && !document.getElementById("stepper").dataset.busy`)); err != nil {
		t.Fatalf("pause did not stop the play: %v", err)
	}
	n, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("stepper").dataset.moves`))
	if err != nil {
		t.Fatal(err)
	}
	v = s.idle(v.ID, func() int { i, _ := strconv.Atoi(n); return i }())
	if len(v.Moves) >= len(v.Planned) {
		t.Fatalf("paused after move %d of %d: nothing left to play", len(v.Moves), len(v.Planned))
	}
	s.check(v)

	play()
	if _, err := chromedp.Run(ctx, poll[bool](`(() => { const d = document.getElementById("stepper").dataset, p = document.getElementById("stepPlay");
		return d.over === "true" && !d.busy && p.textContent === "play" && p.disabled; })()`)); err != nil {
		t.Fatalf("play did not play the schedule to its end and stop: %v", err)
	}
	v = s.idle(v.ID, len(v.Planned))
	s.check(v)
	if ans := v.Attempts[1].Answer; ans == nil || !ans.Replayed || ans.ChargeID != v.Attempts[0].Answer.ChargeID {
		t.Fatalf("attempt 2 did not replay attempt 1's charge: %+v", ans)
	}
	if c := s.lanes()[1].Cells[3]; !strings.Contains(c.Title, "attempt 1") {
		t.Errorf("move 4's blocked cell lost what it was blocked on: %+v", c)
	}
	s.finished(a, v, 1, "linearizable")
	panelShots(ctx, t, "stepper-postgres")
	if p := problems(); len(p) > 0 {
		t.Errorf("the page had problems: %v", p)
	}
}

// forgetful is a toy design for the stepper's test, registered beside the
// built-in ones: a map of answers in the heap, which the window move
// empties for the key and which says what it holds for a key, as the
// stores will. It pauses before its look.
type forgetful struct {
	ledger lab.Ledger
	now    lab.Clock
	mu     sync.Mutex
	seen   map[lab.Scope]lab.Response
}

const forgetfulName lab.StoreName = "forgetful"

func forgetfulVariant() variant.Variant {
	return variant.Variant{
		Name: forgetfulName, Label: "a map that forgets", RequiresKey: true, Effects: "outbox", Crash: variant.CrashWipesHeap,
		Decides: "looks the key up, charges when absent, records the answer",
		Keys:    "a map in this replica's heap, emptied for a key when its window passes",
		Open: func(_ context.Context, d variant.Deps) (lab.Store, error) {
			return &forgetful{ledger: d.Ledger, now: d.Clock, seen: map[lab.Scope]lab.Response{}}, nil
		},
	}
}

func (f *forgetful) Name() lab.StoreName { return forgetfulName }

func (f *forgetful) Charge(ctx context.Context, a lab.Attempt) (lab.Outcome, error) {
	if err := lab.Pause(ctx, lab.PointBeforeClaim); err != nil {
		return lab.Outcome{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if resp, ok := f.seen[a.Scope]; ok {
		return lab.Outcome{Response: resp, Replayed: true}, nil
	}
	resp, err := lab.Perform(ctx, f.ledger, a, f.now())
	if err != nil {
		return lab.Outcome{}, err
	}
	f.seen[a.Scope] = resp
	return lab.Outcome{Response: resp}, nil
}

func (f *forgetful) MakeHappen(_ context.Context, sc lab.Scope, e lab.TimeEvent) error {
	if e != lab.EventWindow {
		return lab.Invalid("event", "%s has no %s to make happen", forgetfulName, e)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.seen, sc)
	return nil
}

func (f *forgetful) TimeMoves() []lab.TimeEvent { return []lab.TimeEvent{lab.EventWindow} }

func (f *forgetful) Inspect(_ context.Context, sc lab.Scope) (lab.KeyInspection, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	in := lab.KeyInspection{Where: "forgetful: the replica's map", State: "absent", Facts: []string{}}
	if resp, ok := f.seen[sc]; ok {
		in.State, in.Facts = lab.KeyCompleted, []string{fmt.Sprintf("answer %d stored", resp.Status)}
	}
	return in, nil
}

// TestStepperMarksAnEvent opens a custom run from the panel's form on a toy
// design that forgets a key when its window passes, and moves it by the
// attempts' and the event's buttons: the window's move is a marker across
// both lanes, labelled with what it did; the store's state after each move
// is the store's (the answer stored, then absent); the late retry charges
// again, and the export replays to the same two charges.
func TestStepperMarksAnEvent(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = append(variants.Builtin(), forgetfulVariant())
	cfg.Addr, cfg.RedisPair, cfg.EmbedPostgres = "127.0.0.1:0", false, false
	a := labtest.Start(t, cfg)
	ctx, problems := browser(t)
	s := stepper{t: t, ctx: ctx, base: a.URL()}

	if err := chromedp.Do(ctx, chromedp.Navigate(a.URL()+"/")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`[...document.querySelectorAll("#stepCustomStore option")].some(o => o.value === "forgetful")`)); err != nil {
		t.Fatalf("the custom form never offered the toy design: %v", err)
	}
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("stepCustomStore"), string(forgetfulName)),
		chromedp.SetValue(chromedp.ID("stepAttempts"), "2"), chromedp.SetValue(chromedp.ID("stepReplicas"), "1"),
		chromedp.Click(chromedp.ID("stepOpenCustom"))); err != nil {
		t.Fatal(err)
	}
	id, err := chromedp.Run(ctx, poll[string](`document.getElementById("stepper").dataset.run`))
	if err != nil {
		t.Fatalf("the form opened no run: %v", err)
	}
	v := s.view(id)
	if v.Store != forgetfulName || len(v.Attempts) != 2 || len(v.Planned) != 0 {
		t.Fatalf("the custom run is %+v", v.View)
	}
	s.check(v)
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#stepNext, #stepPlay").length`)); err != nil || n != 0 {
		t.Errorf("a run without a plan offers next or play (%d, %v)", n, err)
	}
	held := func() string {
		t.Helper()
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`[...document.querySelectorAll("#stepHolds .stored")].map(h => h.dataset.state + ": " + h.textContent).join(" | ")`))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	v = s.click(v, `[data-advance="1"]`) // sent, paused before its look
	v = s.click(v, `[data-advance="1"]`) // charged and answered
	if h := held(); !strings.HasPrefix(h, lab.KeyCompleted+": ") || !strings.Contains(h, "answer 201 stored") {
		t.Errorf("after attempt 1 answered the store panel reads %q", h)
	}
	v = s.click(v, `[data-happen="window"]`)
	type marker struct {
		Event       string  `json:"event"`
		Head        string  `json:"head"`
		Top, Bottom float64 // the marker's, and the lanes' box
		LanesTop    float64 `json:"lanesTop"`
		LanesBottom float64 `json:"lanesBottom"`
	}
	m, err := chromedp.Run(ctx, chromedp.Evaluate[marker](`(() => { const m = document.querySelector('#stepLanes [data-marker="3"]'),
		g = document.querySelector("#stepLanes .steplanes").getBoundingClientRect(), r = m ? m.getBoundingClientRect() : {};
		return { event: m?.dataset.event ?? "", head: document.querySelector('#stepLanes [data-head="3"]').textContent.trim(),
			Top: r.top, Bottom: r.bottom, lanesTop: g.top, lanesBottom: g.bottom }; })()`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Event != "window" || !strings.HasSuffix(m.Head, "window: "+v.Moves[2].Did) || m.Top > m.LanesTop+1 || m.Bottom < m.LanesBottom-1 {
		t.Errorf("the window's move: %+v; want a marker across every lane, headed \"window: %s\"", m, v.Moves[2].Did)
	}
	if h := held(); !strings.HasPrefix(h, "absent: ") {
		t.Errorf("after the window the store panel reads %q", h)
	}
	v = s.click(v, `[data-advance="2"]`)
	v = s.click(v, `[data-advance="2"]`)
	if ans := v.Attempts[1].Answer; ans == nil || ans.Replayed || ans.ChargeID == v.Attempts[0].Answer.ChargeID {
		t.Fatalf("the late retry did not charge again: %+v", ans)
	}
	s.finished(a, v, 2, v.Checked)
	if step.FormatMoves(v.Steps) != "1,1,window,2,2" {
		t.Fatalf("the moves made: %s", step.FormatMoves(v.Steps))
	}
	// A column's head shows the store as it was after that move.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#stepLanes [data-head="2"]`))); err != nil {
		t.Fatal(err)
	}
	if h := held(); !strings.HasPrefix(h, lab.KeyCompleted+": ") {
		t.Errorf("move 2 picked: the store panel reads %q", h)
	}
	panelShots(ctx, t, "stepper-event")

	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("stepReplay"))); err != nil {
		t.Fatal(err)
	}
	id, err = chromedp.Run(ctx, poll[string](fmt.Sprintf(`(() => { const d = document.getElementById("stepper").dataset;
		return d.run !== %q && d.moves === "5" && !d.busy && d.run; })()`, v.ID)))
	if err != nil {
		t.Fatalf("the replay never showed its moves: %v", err)
	}
	r := s.view(id)
	s.check(r)
	s.finished(a, r, 2, r.Checked)
	if p := problems(); len(p) > 0 {
		t.Errorf("the page had problems: %v", p)
	}
}
