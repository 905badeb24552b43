package web_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants"
)

// TestHistoryPictureStaysOnTheLab runs a memory store across three
// replicas, whose history is a violation, and opens its picture from the
// page's link: a self-contained page (porcupine's visualization) that draws
// the attempts' lanes and the ledger's, and asks nothing of any origin but
// the lab's own.
func TestHistoryPictureStaysOnTheLab(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr, cfg.RedisPair, cfg.EmbedPostgres = "127.0.0.1:0", false, false
	a := labtest.Start(t, cfg)
	ctx, problems := browser(t)
	var mu sync.Mutex
	var asked []string
	if err := chromedp.Listen(ctx, func(ev any) {
		if ev, ok := ev.(*network.EventRequestWillBeSent); ok {
			mu.Lock()
			asked = append(asked, ev.Request.URL)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(a.URL()+"/")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll("#store option").length > 1`)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("store"), "memory"), chromedp.SetValue(chromedp.ID("compare"), ""),
		chromedp.SetValue(chromedp.ID("fault"), ""), chromedp.SetValue(chromedp.ID("replicas"), "3"),
		chromedp.SetValue(chromedp.ID("key"), "history-page-1"), chromedp.Click(chromedp.ID("go"))); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`!!document.querySelector("#result .proof a.history")`)); err != nil {
		t.Fatalf("no proof under the run: %v", err)
	}
	type proof struct {
		Checked string `json:"checked"`
		Text    string `json:"text"`
		Href    string `json:"href"`
	}
	got, err := chromedp.Run(ctx, chromedp.Evaluate[proof](`(() => { const p = document.querySelector("#result .proof");
		return { checked: p.dataset.checked, text: p.textContent, href: p.querySelector("a.history").href }; })()`))
	if err != nil {
		t.Fatal(err)
	}
	if got.Checked != "violation" || !strings.Contains(got.Text, "charges for one key") {
		t.Errorf("memory on 3 replicas: the page says %q: %s", got.Checked, got.Text)
	}
	// The run the link names is the one the ledger judged.
	runs := labtest.Decode[struct {
		Runs []experiment.Report `json:"runs"`
	}](t, labtest.Do(t, http.MethodGet, a.URL()+"/lab/runs?limit=1", nil, ""))
	if len(runs.Runs) != 1 || !strings.Contains(got.Href, runs.Runs[0].RunID) || runs.Runs[0].KeyCharges < 2 {
		t.Fatalf("the link %s, the last run %+v", got.Href, runs.Runs)
	}
	r := labtest.Do(t, http.MethodGet, got.Href, nil, "")
	if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("history.html: %d %s", r.Status, r.Header.Get("Content-Type"))
	}

	mu.Lock()
	asked = nil
	mu.Unlock()
	if err := chromedp.Do(ctx, chromedp.Navigate(got.Href)); err != nil {
		t.Fatal(err)
	}
	// Porcupine draws one lane per attempt and one for the ledger's reads.
	if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll("svg text").length > 0`)); err != nil {
		t.Fatalf("the picture was never drawn: %v", err)
	}
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil || !strings.Contains(text, "ledger read") || !strings.Contains(text, "attempt 3") {
		t.Errorf("the picture should name the attempts and the ledger reads (%v):\n%.600s", err, text)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) == 0 {
		t.Fatal("no request seen: the listener saw nothing")
	}
	for _, u := range asked {
		if !strings.HasPrefix(u, a.URL()+"/") {
			t.Errorf("the picture asked %s, outside the lab's origin %s", u, a.URL())
		}
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("the pages had problems: %v", p)
	}
}

// TestCheckADesignOnThePage runs lab check's suite from the page against
// two of the lab's own designs: unsafe fails the storm, memory on one
// replica passes; each case is a row with its verdict.
func TestCheckADesignOnThePage(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr, cfg.RedisPair, cfg.EmbedPostgres = "127.0.0.1:0", false, false
	a := labtest.Start(t, cfg)
	ctx, problems := browser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(a.URL()+"/")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, poll[bool](`document.querySelectorAll("#checkStore option").length > 1`)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		store, verdict, storm string
	}{{"unsafe", "fails", "fail"}, {"memory", "passes", "pass"}} {
		if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`void ($("checkOut").innerHTML = "")`),
			chromedp.SetValue(chromedp.ID("checkStore"), tc.store), chromedp.Click(chromedp.ID("check"))); err != nil {
			t.Fatal(err)
		}
		if _, err := chromedp.Run(ctx, poll[bool](`!!document.getElementById("checkVerdict") || !!document.querySelector("#checkOut .error")`)); err != nil {
			t.Fatalf("%s: no check result: %v", tc.store, err)
		}
		type shown struct {
			Verdict string `json:"verdict"`
			Storm   string `json:"storm"`
			Rows    int    `json:"rows"`
		}
		got, err := chromedp.Run(ctx, chromedp.Evaluate[shown](`({ verdict: document.getElementById("checkVerdict")?.textContent ?? document.querySelector("#checkOut").textContent,
			storm: document.querySelector('#checkOut tr[data-case="storm"]')?.dataset.verdict ?? "",
			rows: document.querySelectorAll("#checkOut tbody tr").length })`))
		if err != nil || !strings.HasPrefix(got.Verdict, tc.verdict) || got.Storm != tc.storm || got.Rows < 10 {
			t.Errorf("%s: the page shows %+v (%v), want %q with the storm %s", tc.store, got, err, tc.verdict, tc.storm)
		}
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("the page had problems: %v", p)
	}
}
