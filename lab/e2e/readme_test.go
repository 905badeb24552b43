package e2e_test

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// curlCommand is one command of the README's walkthrough.
type curlCommand struct {
	line    string
	method  string
	path    string
	header  http.Header
	body    string
	comment string // what the README says the answer shows
}

// readmeWalkthrough reads the curl commands of the README's walkthrough.
func readmeWalkthrough(t *testing.T) []curlCommand {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(readme), "## Walkthrough (curl)")
	_, block, _ = strings.Cut(block, "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	var cmds []curlCommand
	var joined string
	for _, l := range strings.Split(block, "\n") {
		if strings.HasSuffix(l, "\\") {
			joined += strings.TrimSuffix(l, "\\")
			continue
		}
		l, joined = joined+l, ""
		if !strings.HasPrefix(l, "curl ") {
			continue
		}
		c := curlCommand{line: l, method: http.MethodGet, header: http.Header{}}
		if code, comment, ok := strings.Cut(l, "#"); ok {
			l, c.comment = code, strings.TrimSpace(comment)
		}
		for _, m := range regexp.MustCompile(`-X (\w+)|-H '([^']*)'|-d '([^']*)'|"\$LAB(/[^"]*)"`).FindAllStringSubmatch(l, -1) {
			switch {
			case m[1] != "":
				c.method = m[1]
			case m[2] != "":
				name, value, _ := strings.Cut(m[2], ": ")
				c.header.Add(name, value)
			case m[3] != "":
				c.body = m[3]
				if c.method == http.MethodGet {
					c.method = http.MethodPost // as curl -d does
				}
			case m[4] != "":
				c.path = m[4]
			}
		}
		if c.path == "" {
			t.Errorf("the walkthrough's %q names no \"$LAB/…\" URL", c.line)
		}
		cmds = append(cmds, c)
	}
	// Every command follows the lab's address: set once, as LAB.
	for _, l := range strings.Split(string(readme), "\n") {
		if cmd := strings.TrimSpace(l); strings.HasPrefix(cmd, "curl ") && strings.Contains(cmd, "://") {
			t.Errorf("README.md: %q hard-codes an address instead of $LAB", cmd)
		}
	}
	if len(cmds) < 8 {
		t.Fatalf("found %d commands in the README's walkthrough", len(cmds))
	}
	return cmds
}

// TestReadmeWalkthroughTwice runs the README's walkthrough twice on one lab:
// every run's verdict, explanation and figures agree with each other and
// with the ledger, and what the README promises holds on both passes.
func TestReadmeWalkthroughTwice(t *testing.T) {
	t.Parallel()
	a := labtest.Start(t, e2e.FullConfig(t))
	cmds := readmeWalkthrough(t)
	for pass := 1; pass <= 2; pass++ {
		for _, c := range cmds {
			r := labtest.Do(t, c.method, a.URL()+c.path, c.header, c.body)
			if r.Status >= 500 {
				t.Fatalf("pass %d: %s: %d %s", pass, c.line, r.Status, r.Body)
			}
			var probe struct {
				Verdict string `json:"verdict"`
			}
			if json.Unmarshal(r.Body, &probe) != nil || probe.Verdict == "" {
				continue // not a run: the charge API's own answers are tested elsewhere
			}
			rep := labtest.Decode[experiment.Report](t, r)
			name := "pass " + strconv.Itoa(pass) + ": " + c.path
			e2e.CheckExplanation(t, name, rep)
			if n := e2e.KeyCharges(t, a, rep.Tenant, rep.Store, rep.Key); n != rep.KeyCharges {
				t.Errorf("%s: the report says %d charges for the key, the ledger %d", name, rep.KeyCharges, n)
			}
			if m := regexp.MustCompile(`^(\d+) charges?`).FindStringSubmatch(c.comment); m != nil {
				if want, _ := strconv.Atoi(m[1]); rep.ChargesApplied != want {
					t.Errorf("%s: the README promises %d charge(s), the run added %d: %s", name, want, rep.ChargesApplied, rep.Explanation)
				}
			}
			if strings.HasPrefix(c.comment, ">1 charge") && rep.ChargesApplied < 2 {
				t.Errorf("%s: the README promises more than one charge, the run added %d", name, rep.ChargesApplied)
			}
		}
	}
}
