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

// TestConfigurationTable checks the configuration table (docs/configuration.md,
// which the README links to) against what `lab serve --help` prints: every
// flag, its environment variable and its default, in both, the same.
func TestConfigurationTable(t *testing.T) {
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
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, found := strings.Cut(string(doc), "\n## Every flag\n")
	if !found {
		t.Fatal(`docs/configuration.md lacks its "## Every flag" section`)
	}
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
			t.Errorf("-%s (env %s, default %s) is missing from docs/configuration.md", name, h.env, h.def)
		case d != h:
			t.Errorf("-%s: docs/configuration.md says env %s, default %s; --help says env %s, default %s", name, d.env, d.def, h.env, h.def)
		}
	}
	for name := range documented {
		if _, ok := help[name]; !ok {
			t.Errorf("docs/configuration.md documents -%s, which lab serve does not have", name)
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
