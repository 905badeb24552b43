package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
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
	"github.com/idempotency-lab/lab/variants"
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

// TestPageBuildsItsControlsFromTheIndex opens the page in Chromium on a lab
// with a throwaway variant registered beside the built-in ones: the store
// control lists exactly the index's variants (unavailable ones disabled),
// the fault control every fault, each fault shows only its own parameters,
// and a run on the new variant answers on the page.
func TestPageBuildsItsControlsFromTheIndex(t *testing.T) {
	cfg := app.DefaultConfig()
	cfg.Variants = append(variants.Builtin(), labtest.LookFirst())
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
	step, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(a.URL()+"/")); err != nil {
		t.Fatalf("opening the page: %v", err)
	}
	if _, err := chromedp.Run(step, chromedp.Poll[bool](`document.querySelectorAll("#store option").length > 0`)); err != nil {
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
	if last := stores[len(stores)-1]; last.Value != "look-first" || last.Disabled {
		t.Errorf("the registered toy variant is %+v in the page", last)
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
			want = append(want, fmt.Sprintf("%s=%d", p, f.Defaults[p]))
		}
		if !slices.Equal(shown, want) && !(len(shown) == 0 && len(want) == 0) {
			t.Errorf("fault %s shows %v, want %v", f.Point, shown, want)
		}
	}

	// A run on the new variant, from the page.
	if err := chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("store"), "look-first"),
		chromedp.SetValue(chromedp.ID("fault"), ""),
		chromedp.SetValue(chromedp.ID("key"), "page-toy-1"),
		chromedp.Click(chromedp.ID("go")),
	); err != nil {
		t.Fatal(err)
	}
	verdict, err := chromedp.Run(step, chromedp.Poll[string](`document.querySelector("#result .verdict")?.textContent`))
	if err != nil {
		t.Fatalf("no verdict on the page: %v", err)
	}
	if !strings.HasPrefix(verdict, "look-first: ") {
		t.Errorf("verdict %q, want the toy variant's run", verdict)
	}
	if k, err := a.Books().KeyCharges(context.Background(), "acme", "look-first", "page-toy-1"); err != nil || k.Charges < 1 {
		t.Errorf("the page's run left %d charges in the ledger (%v)", k.Charges, err)
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("the page had problems: %v", p)
	}
}
