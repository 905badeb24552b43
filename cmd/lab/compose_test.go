package main

import (
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The container files only read here: nothing is built or started, so these
// tests run without Docker. CI also runs `docker-compose config -q`.

const (
	composePath    = "../../compose.go.yml"
	dockerfilePath = "../../Dockerfile"
	readmePath     = "../../README.md"
	composeUp      = "docker compose -f compose.go.yml up --build"
)

var labReplicas = []string{"lab1", "lab2", "lab3"}

type composeFile struct {
	Version  string                    `yaml:"version"`
	Services map[string]composeService `yaml:"services"`
}

// composeService keeps the fields Compose allows in several shapes as any
// (short or long syntax); the helpers below read both.
type composeService struct {
	Image       string `yaml:"image"`
	Build       any    `yaml:"build"`
	Command     any    `yaml:"command"`
	Environment any    `yaml:"environment"`
	Ports       []any  `yaml:"ports"`
	DependsOn   any    `yaml:"depends_on"`
	Healthcheck *struct {
		Test    any  `yaml:"test"`
		Disable bool `yaml:"disable"`
	} `yaml:"healthcheck"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	raw, err := os.ReadFile(composePath)
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", composePath, err)
	}
	return f
}

// env reads a map or a KEY=VALUE list.
func (s composeService) env() map[string]string {
	out := map[string]string{}
	switch e := s.Environment.(type) {
	case map[string]any:
		for k, v := range e {
			if v != nil {
				out[k] = fmt.Sprint(v)
			}
		}
	case []any:
		for _, kv := range e {
			k, v, _ := strings.Cut(fmt.Sprint(kv), "=")
			out[k] = v
		}
	}
	return out
}

// publishes reports whether a port entry maps host port p to container port p.
func (s composeService) publishes(p int) bool {
	for _, entry := range s.Ports {
		switch e := entry.(type) {
		case map[string]any:
			if fmt.Sprint(e["published"]) == strconv.Itoa(p) && fmt.Sprint(e["target"]) == strconv.Itoa(p) {
				return true
			}
		default:
			// [HOST_IP:]PUBLISHED:TARGET[/PROTOCOL]
			spec, _, _ := strings.Cut(fmt.Sprint(e), "/")
			parts := strings.Split(spec, ":")
			if len(parts) >= 2 && parts[len(parts)-2] == strconv.Itoa(p) && parts[len(parts)-1] == strconv.Itoa(p) {
				return true
			}
		}
	}
	return false
}

// waitsHealthy reports whether the service waits for dep's health check.
func (s composeService) waitsHealthy(dep string) bool {
	m, ok := s.DependsOn.(map[string]any)
	if !ok {
		return false
	}
	d, ok := m[dep].(map[string]any)
	return ok && d["condition"] == "service_healthy"
}

// dockerfile is the build context and Dockerfile of the service, "" when it
// has no build.
func (s composeService) dockerfile() (dir, dockerfile string) {
	switch b := s.Build.(type) {
	case string:
		return b, "Dockerfile"
	case map[string]any:
		dir, dockerfile = fmt.Sprint(b["context"]), "Dockerfile"
		if d, ok := b["dockerfile"].(string); ok {
			dockerfile = d
		}
		return dir, dockerfile
	}
	return "", ""
}

// hosts returns the host names of comma-separated base URLs.
func hosts(t *testing.T, list string) []string {
	t.Helper()
	var out []string
	for raw := range strings.SplitSeq(list, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || u.Scheme != "http" || u.Port() != "8616" {
			t.Errorf("%q is not an http://host:8616 URL", raw)
			continue
		}
		out = append(out, u.Hostname())
	}
	slices.Sort(out)
	return out
}

func TestComposeServices(t *testing.T) {
	f := loadCompose(t)
	if f.Version != "" {
		t.Errorf("top-level version %q: drop it, docker-compose v1 then rejects depends_on conditions", f.Version)
	}
	for _, name := range append([]string{"postgres", "redis", "front"}, labReplicas...) {
		if _, ok := f.Services[name]; !ok {
			t.Errorf("service %s missing", name)
		}
	}
	for name, s := range f.Services {
		if s.Healthcheck == nil || s.Healthcheck.Disable || s.Healthcheck.Test == nil {
			t.Errorf("service %s has no health check", name)
		}
		if name != "front" && len(s.Ports) > 0 {
			t.Errorf("service %s publishes %v: only the front is published", name, s.Ports)
		}
	}
	if front := f.Services["front"]; !front.publishes(8616) {
		t.Errorf("front publishes %v, want 8616:8616", front.Ports)
	}
}

func TestComposeReplicas(t *testing.T) {
	f := loadCompose(t)
	for _, name := range labReplicas {
		s, ok := f.Services[name]
		if !ok {
			t.Errorf("service %s missing", name)
			continue
		}
		env := s.env()
		if u, err := url.Parse(env["DATABASE_URL"]); err != nil || u.Hostname() != "postgres" {
			t.Errorf("%s: DATABASE_URL = %q, want the postgres service", name, env["DATABASE_URL"])
		}
		if u, err := url.Parse(env["REDIS_URL"]); err != nil || u.Hostname() != "redis" {
			t.Errorf("%s: REDIS_URL = %q, want the redis service", name, env["REDIS_URL"])
		}
		others := slices.DeleteFunc(slices.Clone(labReplicas), func(n string) bool { return n == name })
		if got := hosts(t, env["LAB_PEERS"]); !slices.Equal(got, others) {
			t.Errorf("%s: LAB_PEERS = %q names %v, want %v", name, env["LAB_PEERS"], got, others)
		}
		for _, k := range []string{"LAB_EMBEDDED_POSTGRES", "LAB_EMBEDDED_REDIS"} {
			if env[k] != "off" {
				t.Errorf("%s: %s = %q, want off", name, k, env[k])
			}
		}
		if ctx, df := s.dockerfile(); ctx != "." || df != "Dockerfile" {
			t.Errorf("%s builds context %q, dockerfile %q; want . and Dockerfile", name, ctx, df)
		}
		for _, dep := range []string{"postgres", "redis"} {
			if !s.waitsHealthy(dep) {
				t.Errorf("%s does not wait for %s to be healthy", name, dep)
			}
		}
	}
	replicas := map[string]bool{}
	for _, name := range labReplicas {
		replicas[f.Services[name].env()["LAB_REPLICA"]] = true
	}
	if len(replicas) != len(labReplicas) || replicas[""] {
		t.Errorf("LAB_REPLICA must be set and differ per replica, got %v", replicas)
	}

	front := f.Services["front"]
	if got := hosts(t, front.env()["LAB_PROXY_TARGETS"]); !slices.Equal(got, labReplicas) {
		t.Errorf("front: LAB_PROXY_TARGETS names %v, want %v", got, labReplicas)
	}
	for _, dep := range labReplicas {
		if !front.waitsHealthy(dep) {
			t.Errorf("front does not wait for %s to be healthy", dep)
		}
	}
}

func TestComposeDockerfile(t *testing.T) {
	raw, err := os.ReadFile(dockerfilePath)
	if err != nil {
		t.Fatal(err)
	}
	instr := regexp.MustCompile(`(?im)^\s*([a-z]+)\s+(.*)$`)
	var froms int
	var user string // the last USER of the final stage
	multiStageCopy := false
	for _, m := range instr.FindAllStringSubmatch(string(raw), -1) {
		switch strings.ToUpper(m[1]) {
		case "FROM":
			froms++
			user = ""
		case "USER":
			user = strings.TrimSpace(m[2])
		case "COPY":
			multiStageCopy = multiStageCopy || strings.HasPrefix(m[2], "--from=")
		}
	}
	if froms < 2 || !multiStageCopy {
		t.Errorf("Dockerfile: %d FROM, COPY --from %v; want a multi-stage build", froms, multiStageCopy)
	}
	name, _, _ := strings.Cut(user, ":")
	if name == "" || name == "root" || name == "0" {
		t.Errorf("Dockerfile: final stage USER %q, want a non-root user", user)
	}
}

func TestComposeREADME(t *testing.T) {
	raw, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), composeUp) {
		t.Errorf("README.md does not show %q", composeUp)
	}
}
