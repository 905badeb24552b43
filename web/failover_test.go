package web_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants"
)

// TestPageDrawsAPostgreSQLFailover: the page's link fires a PostgreSQL
// failover and draws it: asynchronous, the first attempt's charge on the
// old primary marked lost, the ledger holding only the surviving charge;
// synchronous, the first attempt without an answer and nothing lost.
func TestPageDrawsAPostgreSQLFailover(t *testing.T) {
	t.Parallel()
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr, cfg.EmbedPostgres, cfg.RedisPair = "127.0.0.1:0", false, false
	cfg.DatabaseURL, cfg.PGSchema = labtest.Postgres(t)
	a := labtest.Start(t, cfg)
	ctx, problems := browser(t)
	type drawn struct {
		Lost       string   `json:"lost"`
		LostLane   bool     `json:"lostLane"`
		Text       string   `json:"text"`
		Ledger     string   `json:"ledger"`
		LostItems  []string `json:"lostItems"`
		LedgerRows []string `json:"ledgerRows"`
	}
	for mode, want := range map[string]struct {
		lost     string
		lostLane bool
		says     string
	}{
		"async": {"1", true, "the promoted standby never received"},
		"sync":  {"0", false, "waited for the standby and never answered"},
	} {
		if err := chromedp.Do(ctx, chromedp.Navigate(a.URL()+"/?store=postgres&compare=&fault=pg_failover&replication="+mode+"&fire=1")); err != nil {
			t.Fatal(err)
		}
		if _, err := chromedp.Run(ctx, poll[bool](`!!document.querySelector("#result .failover")`)); err != nil {
			t.Fatalf("%s: no failover drawn: %v", mode, err)
		}
		d, err := chromedp.Run(ctx, chromedp.Evaluate[drawn](`(() => { const f = document.querySelector("#result .failover");
			return { lost: f.dataset.lost, lostLane: !!document.querySelector('#result .lane[data-attempt="1"] rect.try.lost'), text: f.textContent,
				ledger: document.querySelector("#result .ledger").dataset.charges,
				lostItems: [...f.querySelectorAll("li.lost")].map(li => li.dataset.charge),
				ledgerRows: [...document.querySelectorAll("#result table.rows td:first-child")].map(td => td.textContent) } })()`))
		if err != nil {
			t.Fatal(err)
		}
		if d.Lost != want.lost || d.LostLane != want.lostLane || !strings.Contains(d.Text, want.says) || d.Ledger != "1" || len(d.LostItems) != 1 || len(d.LedgerRows) != 1 {
			t.Errorf("%s: drawn %+v, want %s lost and acknowledged, the lost lane %v, saying %q, one ledger row", mode, d, want.lost, want.lostLane, want.says)
		}
		// The lost charge is no row of the run's ledger.
		if len(d.LostItems) == 1 && len(d.LedgerRows) == 1 && strings.HasPrefix(d.LostItems[0], strings.TrimSuffix(d.LedgerRows[0], "…")) {
			t.Errorf("%s: the lost charge %s is listed as a ledger row of the run", mode, d.LostItems[0])
		}
		// The run's own figures are the pair's books; the account's balance
		// is the lab's books', as /idempotency/state reads it.
		state := labtest.Decode[struct {
			Balance map[string]int64 `json:"balance_cents"`
		}](t, labtest.Do(t, http.MethodGet, a.URL()+"/idempotency/state", nil, ""))
		tiles, err := chromedp.Run(ctx, chromedp.Evaluate[map[string][]string](`Object.fromEntries([...document.querySelectorAll("#result [data-figure]")].map(f =>
			[f.dataset.figure, [f.querySelector("b").textContent, f.dataset.books ?? "", f.querySelector(".books")?.textContent ?? ""]]))`))
		if err != nil {
			t.Fatal(err)
		}
		balance := fmt.Sprintf("$%d.%02d", state.Balance["acme"]/100, state.Balance["acme"]%100)
		if b := tiles["total-balance"]; len(b) != 3 || b[0] != balance || b[1] != "lab" || !strings.Contains(b[2], "lab's books") {
			t.Errorf("%s: the balance tile shows %q; want the lab's books' %s (/idempotency/state), saying so", mode, b, balance)
		}
		for _, name := range []string{"run-charges", "run-cents"} {
			if f := tiles[name]; len(f) != 3 || f[1] != "pair" || !strings.Contains(f[2], "PostgreSQL pair's books") {
				t.Errorf("%s: the tile %s shows %q; want it said to be the PostgreSQL pair's books", mode, name, f)
			}
		}
		shots(ctx, t, "pg-failover-"+mode)
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("the page reported problems: %v", p)
	}
}
