package main

import (
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/variant"
	"github.com/idempotency-lab/lab/variants"
)

// docs is the README and every page of docs/, by path.
func docs(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range append(paths, "../../README.md") {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(p, "../../")] = string(b)
	}
	return out
}

// section is what doc holds under its heading, up to the next one.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	_, s, ok := strings.Cut(doc, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("no section %q", heading)
	}
	s, _, _ = strings.Cut(s, "\n## ")
	return s
}

// firstCells are the backticked words of the first column of a section's table.
func firstCells(s string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(s, "\n") {
		first, _, ok := strings.Cut(strings.TrimPrefix(l, "| "), " | ")
		if !strings.HasPrefix(l, "| `") || !ok {
			continue
		}
		var row []string
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(first, -1) {
			row = append(row, m[1])
		}
		rows = append(rows, row)
	}
	return rows
}

var numberWords = map[string]int{"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
	"nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "twenty": 20}

func count(word string) int {
	if n, err := strconv.Atoi(word); err == nil {
		return n
	}
	return numberWords[strings.ToLower(word)]
}

// TestDocsCountTheDesigns: wherever the docs count the designs, or list
// them, they name the registered ones, all of them.
func TestDocsCountTheDesigns(t *testing.T) {
	t.Parallel()
	var names []string
	for _, v := range variants.Builtin() {
		names = append(names, string(v.Name))
	}
	for path, doc := range docs(t) {
		doc = strings.ReplaceAll(doc, "checks two designs from the panel", "") // some designs, not all of them
		for _, m := range regexp.MustCompile(`(?i)\b(\w+)\s+designs\b|\bthe (\w+) above\b`).FindAllStringSubmatch(doc, -1) {
			if n := count(m[1] + m[2]); n > 0 && n != len(names) {
				t.Errorf("%s: %q, but there are %d designs", path, m[0], len(names))
			}
		}
		for _, m := range regexp.MustCompile(`store=([a-z+-]+(?:\|[a-z+-]+)+)`).FindAllStringSubmatch(doc, -1) {
			if got := strings.Split(m[1], "|"); !slices.Equal(got, names) {
				t.Errorf("%s: store=%s, want %s", path, m[1], strings.Join(names, "|"))
			}
		}
	}
	var rows []string
	for _, r := range firstCells(section(t, docs(t)["README.md"], "## The eight designs")) {
		rows = append(rows, r[0])
	}
	if !slices.Equal(rows, names) {
		t.Errorf("the README's table of designs lists %v, the lab registers %v", rows, names)
	}
}

// TestDocsDefineBreaks: a run breaks when the ledger holds more charges
// than expected, or when a charge a client was told of is gone (the
// asynchronous PostgreSQL failover's cells break with 1 charge or none):
// wherever the docs define the verdict, they say both.
func TestDocsDefineBreaks(t *testing.T) {
	t.Parallel()
	d := docs(t)
	for what, def := range map[string]string{
		"the README's glossary": regexp.MustCompile(`(?m)^\| verdict \|.*$`).FindString(d["README.md"]),
		"docs/runs.md":          section(t, d["docs/runs.md"], "## The verdict"),
	} {
		_, breaks, _ := strings.Cut(def, "`breaks`")
		breaks, _, _ = strings.Cut(breaks, "`inconclusive`")
		for _, way := range []string{"more", "told of"} {
			if !strings.Contains(breaks, way) {
				t.Errorf("%s defines breaks without %q: %q", what, way, breaks)
			}
		}
	}
}

// TestDocsCountTheMatrix: the README's matrix says how many scenarios,
// designs, cells and runs the code that builds it makes (planned, not
// run: every service present).
func TestDocsCountTheMatrix(t *testing.T) {
	t.Parallel()
	reg, err := variant.NewRegistry(variants.Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	mx := (&experiment.Runner{Variants: reg}).PlanMatrix(experiment.MatrixRequest{
		Stores:      reg.Names(),
		Unavailable: func(lab.StoreName) string { return "" },
	})
	want := map[string]int{"scenarios": len(mx.Rows), "designs": len(mx.Stores), "cells": len(mx.Rows) * len(mx.Stores), "runs": mx.Runs()}
	readme := docs(t)["README.md"]
	matrix, _, _ := strings.Cut(section(t, readme, "## The breakage matrix"), "```")
	quickstart := regexp.MustCompile(`(?m)^.*cmd/lab matrix +#.*$`).FindString(readme)
	for what, text := range map[string]string{"the matrix's section": matrix, "the quickstart's matrix": quickstart} {
		said := map[string]int{}
		for _, m := range regexp.MustCompile(`\b(\d+) (scenarios|designs|cells|runs)\b`).FindAllStringSubmatch(text, -1) {
			said[m[2]], _ = strconv.Atoi(m[1])
		}
		if said["runs"] == 0 {
			t.Errorf("%s does not say how many runs the matrix makes (%d):\n%s", what, want["runs"], text)
		}
		for noun, n := range said {
			if n != want[noun] {
				t.Errorf("%s says %d %s; the matrix has %d", what, n, noun, want[noun])
			}
		}
	}
}

// TestDocsCountTheFaults: the README's table of faults lists every fault
// the lab injects, and no other.
func TestDocsCountTheFaults(t *testing.T) {
	t.Parallel()
	var want, got []string
	for _, f := range lab.FaultSpecs() {
		want = append(want, string(f.Point))
	}
	for _, r := range firstCells(section(t, docs(t)["README.md"], "## Faults")) {
		got = append(got, r[0])
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("the README's faults %v, the lab's %v", got, want)
	}
}

// TestDocsListTheRoutes: the README's table of routes holds every route
// the lab's server registers, with its methods (a row naming none is GET
// and POST), and nothing else; and every route the docs name is one.
func TestDocsListTheRoutes(t *testing.T) {
	t.Parallel()
	a := startLab(t)
	index := labtest.Decode[struct {
		RouteParams map[string][]string `json:"route_params"`
	}](t, labtest.Do(t, http.MethodGet, a.URL()+"/", http.Header{"Accept": {"application/json"}}, ""))
	pattern := regexp.MustCompile(`:\w+|\{\w+\}`)
	route := func(spec string) (method, path string) {
		if m, p, ok := strings.Cut(spec, " "); ok && strings.ToUpper(m) == m {
			method, spec = m, p
		}
		spec, _, _ = strings.Cut(spec, "?")
		return method, pattern.ReplaceAllString(spec, "{}")
	}
	registered := map[string][]string{} // path: methods
	for k := range index.RouteParams {
		m, p := route(k)
		registered[p] = append(registered[p], m)
	}
	if len(registered) < 10 {
		t.Fatalf("the index lists %d routes", len(registered))
	}
	listed := map[string]bool{} // "METHOD path"
	for _, row := range firstCells(section(t, docs(t)["README.md"], "## Lab routes")) {
		for _, spec := range row {
			m, p := route(spec)
			methods := []string{m}
			if m == "" {
				methods = []string{http.MethodGet, http.MethodPost}
			}
			switch have := registered[p]; {
			case len(have) == 0:
				t.Errorf("the README lists %q, which the lab does not serve", spec)
			case m == "" && !slices.Equal(slices.Sorted(slices.Values(have)), methods), m != "" && !slices.Contains(have, m):
				t.Errorf("the README lists %q; the lab serves %s %s", spec, strings.Join(have, ", "), p)
			}
			for _, m := range methods {
				listed[m+" "+p] = true
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(registered)) {
		for _, m := range registered[p] {
			if !listed[m+" "+p] {
				t.Errorf("the lab serves %s %s, which the README's table of routes lacks", m, p)
			}
		}
	}
	// The provider's routes (/provider/…) and the front's (/front/…) are
	// other servers'.
	for path, doc := range docs(t) {
		for _, m := range regexp.MustCompile("`((?:GET|POST|PUT|DELETE) /[^`]*)`").FindAllStringSubmatch(doc, -1) {
			method, p := route(m[1])
			if strings.HasPrefix(p, "/provider/") || strings.HasPrefix(p, "/front/") {
				continue
			}
			if !slices.Contains(registered[p], method) {
				t.Errorf("%s names %s, which the lab does not serve", path, m[1])
			}
		}
	}
}

// TestDocsOfTheExerciseScripts: each of the exercise's scripts says,
// in its --help, the first line of its own docstring: the broken twin is
// not called the reference.
func TestDocsOfTheExerciseScripts(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("LAB_REQUIRE_SERVICES") == "1" {
			t.Fatal("the exercise's scripts need python3; LAB_REQUIRE_SERVICES=1 makes that a failure")
		}
		t.Skip("the exercise's scripts need python3")
	}
	scripts, err := filepath.Glob("../../scripts/exercise/*.py")
	if err != nil || len(scripts) < 2 {
		t.Fatalf("scripts %v: %v", scripts, err)
	}
	for _, s := range scripts {
		src, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		_, doc, _ := strings.Cut(string(src), `"""`)
		first, _, _ := strings.Cut(doc, "\n")
		help, err := exec.Command(py, s, "--help").Output()
		if err != nil {
			t.Fatalf("%s --help: %v", s, err)
		}
		if !strings.Contains(strings.Join(strings.Fields(string(help)), " "), first) {
			t.Errorf("%s --help does not say %q:\n%s", filepath.Base(s), first, help)
		}
	}
}
