package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestReadmeConfigTable checks the README's configuration table against
// what `lab serve --help` prints: every flag, its environment variable and
// its default, in both, the same.
func TestReadmeConfigTable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"serve", "--help"}, &stdout, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("serve --help: %v", err)
	}
	type row struct{ env, def string }
	help := map[string]row{}
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+)\s+env (\S+)\s+default (.*)$`).FindAllStringSubmatch(stderr.String(), -1) {
		help[m[1]] = row{m[2], strings.TrimSpace(m[3])}
	}
	if len(help) < 20 {
		t.Fatalf("--help lists %d settings:\n%s", len(help), stderr.String())
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(readme), "\n## Configuration\n")
	section, _, _ = strings.Cut(section, "\n## ")
	documented := map[string]row{}
	for _, m := range regexp.MustCompile("(?m)^\\| `-([a-z-]+)` \\| `([A-Z_]+)` \\| (`[^`]*`|) \\|").FindAllStringSubmatch(section, -1) {
		def := strings.Trim(m[3], "`")
		if def == "" {
			def = `""`
		}
		documented[m[1]] = row{m[2], def}
	}
	for name, h := range help {
		d, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("-%s (env %s, default %s) is missing from the README's table", name, h.env, h.def)
		case d != h:
			t.Errorf("-%s: README says env %s, default %s; --help says env %s, default %s", name, d.env, d.def, h.env, h.def)
		}
	}
	for name := range documented {
		if _, ok := help[name]; !ok {
			t.Errorf("the README documents -%s, which lab serve does not have", name)
		}
	}
}

// TestEnvironmentAndFlags: the environment sets a field, a flag wins over
// it, and a bad value names its variable.
func TestEnvironmentAndFlags(t *testing.T) {
	t.Setenv("LAB_DEDUPE_WINDOW", "90s")
	t.Setenv("LAB_REPLICA", "from-env")
	m := NewMain(&bytes.Buffer{})
	if err := m.ParseFlags([]string{"-replica", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if m.Config.Window != 90*time.Second || m.Config.Replica != "from-flag" {
		t.Fatalf("window %s, replica %s", m.Config.Window, m.Config.Replica)
	}
	t.Setenv("LAB_CLAIM_TTL", "soon")
	if err := NewMain(&bytes.Buffer{}).ParseFlags(nil); err == nil || !strings.Contains(err.Error(), "LAB_CLAIM_TTL") {
		t.Fatalf("bad environment value: %v", err)
	}
}
