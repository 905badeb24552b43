package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
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
	Image       string   `yaml:"image"`
	Build       any      `yaml:"build"`
	Command     any      `yaml:"command"`
	Environment any      `yaml:"environment"`
	Ports       []any    `yaml:"ports"`
	Volumes     []any    `yaml:"volumes"`
	Profiles    []string `yaml:"profiles"`
	DependsOn   any      `yaml:"depends_on"`
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
		if _, observe := observeServices[name]; name != "front" && !observe && len(s.Ports) > 0 {
			t.Errorf("service %s publishes %v: only the front (and, on loopback, the observe profile) is published", name, s.Ports)
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
		// Listening beyond loopback, a replica of a cluster needs the one
		// admin token its peers share: required, with no default.
		if v := env["LAB_ADMIN_TOKEN"]; !strings.HasPrefix(v, "${LAB_ADMIN_TOKEN:?") || !strings.HasSuffix(v, "}") {
			t.Errorf("%s: LAB_ADMIN_TOKEN = %q, want ${LAB_ADMIN_TOKEN:?…}: required, with no default", name, v)
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

// --- The observe profile: Prometheus and Grafana (docs/observe/).

const (
	repoRoot              = "../.."
	observeProfile        = "observe"
	prometheusConfigPath  = "docs/observe/prometheus.yml"
	grafanaProvisioning   = "docs/observe/grafana/provisioning"
	grafanaDashboardsDir  = "docs/observe/grafana/dashboards"
	grafanaDatasourcePath = grafanaProvisioning + "/datasources/prometheus.yml"
	grafanaProviderPath   = grafanaProvisioning + "/dashboards/lab.yml"
	dashboardPath         = grafanaDashboardsDir + "/lab.json"
	dashboardTitle        = "Idempotency lab: the signals to watch"
)

// observeServices are the services of the observe profile, with their image
// repository and the one port each publishes (on 127.0.0.1 only).
var observeServices = map[string]struct {
	image string
	port  int
}{
	"prometheus": {"prom/prometheus", 9090},
	"grafana":    {"grafana/grafana", 3000},
}

// labMetrics is the contract between the lab and lab.json: the series the
// dashboard may chart, each with its labels. Every expression of lab.json
// names only these, and every one of them is charted.
var labMetrics = map[string][]string{
	"lab_oldest_inflight_key_age_seconds": {"store"},
	"lab_outbox_oldest_pending_seconds":   nil,
	"lab_outbox_pending":                  nil,
	"lab_relay_deliveries_total":          {"outcome"},
	"lab_webhooks_total":                  {"outcome"},
	"lab_charge_rollbacks_total":          {"store"},
	"lab_charge_crashes_total":            {"store"},
	"lab_keys_swept_total":                {"store"},
	"lab_charge_duration_seconds_bucket":  {"store", "outcome", "le"},
	"lab_idempotency_replays_total":       {"store"},
	"lab_charges_applied_total":           {"store"},
	"lab_idempotency_in_progress_total":   {"store"},
}

// labOutcomes are the values the outcome label takes, where the contract
// names them.
var labOutcomes = map[string][]string{
	"lab_relay_deliveries_total": {"delivered", "failed", "dead", "fenced"},
	"lab_webhooks_total":         {"applied", "duplicate", "ignored", "bad_signature", "unknown_charge"},
}

// targetLabels are added by Prometheus to every scraped series.
var targetLabels = []string{"job", "instance"}

// readRepoYAML decodes a YAML file of the repository, rejecting fields out
// of its struct when strict.
func readRepoYAML(t *testing.T, path string, v any, strict bool) {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(strict)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// loopbackOnly reports whether the service publishes ports, all of them on
// 127.0.0.1.
func (s composeService) loopbackOnly() bool {
	for _, entry := range s.Ports {
		switch e := entry.(type) {
		case map[string]any:
			if e["host_ip"] != "127.0.0.1" {
				return false
			}
		default:
			spec, _, _ := strings.Cut(fmt.Sprint(e), "/")
			if parts := strings.Split(spec, ":"); len(parts) != 3 || parts[0] != "127.0.0.1" {
				return false
			}
		}
	}
	return len(s.Ports) > 0
}

type composeMount struct {
	source, target string // source relative to the repository root
	readOnly       bool
}

// mounts reads the short (SRC:DST[:MODE]) and long volume syntax.
func (s composeService) mounts() []composeMount {
	var out []composeMount
	for _, entry := range s.Volumes {
		switch e := entry.(type) {
		case map[string]any:
			ro, _ := e["read_only"].(bool)
			out = append(out, composeMount{fmt.Sprint(e["source"]), fmt.Sprint(e["target"]), ro})
		default:
			parts := strings.Split(fmt.Sprint(e), ":")
			if len(parts) < 2 {
				continue
			}
			m := composeMount{source: parts[0], target: parts[1]}
			if len(parts) > 2 {
				m.readOnly = slices.Contains(strings.Split(parts[2], ","), "ro")
			}
			out = append(out, m)
		}
	}
	return out
}

// mountOf is the mount of the repository path src, if any.
func (s composeService) mountOf(src string) (composeMount, bool) {
	for _, m := range s.mounts() {
		if filepath.Clean(m.source) == filepath.Clean(src) {
			return m, true
		}
	}
	return composeMount{}, false
}

// dependsOn reads the list and the map form.
func (s composeService) dependsOn(dep string) bool {
	switch d := s.DependsOn.(type) {
	case []any:
		return slices.Contains(d, any(dep))
	case map[string]any:
		_, ok := d[dep]
		return ok
	}
	return false
}

// commandFlag is the value of --name=value in the service's command.
func (s composeService) commandFlag(name string) (string, bool) {
	var args []string
	switch c := s.Command.(type) {
	case string:
		args = strings.Fields(c)
	case []any:
		for _, a := range c {
			args = append(args, fmt.Sprint(a))
		}
	}
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// The provider file of the Grafana dashboards.
type grafanaProviders struct {
	Providers []struct {
		Name    string `yaml:"name"`
		Type    string `yaml:"type"`
		Options struct {
			Path string `yaml:"path"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

type grafanaDatasources struct {
	Datasources []struct {
		Name   string `yaml:"name"`
		UID    string `yaml:"uid"`
		Type   string `yaml:"type"`
		Access string `yaml:"access"`
		URL    string `yaml:"url"`
	} `yaml:"datasources"`
}

var pinnedTag = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+$`)

func TestComposeObserveServices(t *testing.T) {
	f := loadCompose(t)
	var inProfile []string
	for name, s := range f.Services {
		if _, observe := observeServices[name]; observe {
			if !slices.Equal(s.Profiles, []string{observeProfile}) {
				t.Errorf("%s: profiles %v, want [%s]", name, s.Profiles, observeProfile)
			}
		} else if len(s.Profiles) > 0 {
			// A profile keeps a service out of a plain `docker compose up`.
			t.Errorf("%s: profiles %v: the cluster's own services carry none", name, s.Profiles)
		}
		if slices.Contains(s.Profiles, observeProfile) {
			inProfile = append(inProfile, name)
		}
	}
	slices.Sort(inProfile)
	if want := []string{"grafana", "prometheus"}; !slices.Equal(inProfile, want) {
		t.Errorf("services of profile %s: %v, want %v", observeProfile, inProfile, want)
	}

	for name, want := range observeServices {
		s, ok := f.Services[name]
		if !ok {
			t.Errorf("service %s missing", name)
			continue
		}
		repo, tag, _ := strings.Cut(s.Image, ":")
		if repo != want.image || !pinnedTag.MatchString(tag) {
			t.Errorf("%s: image %q, want %s pinned to a version tag", name, s.Image, want.image)
		}
		if s.Build != nil {
			t.Errorf("%s: builds, want the upstream image", name)
		}
		if !s.publishes(want.port) || !s.loopbackOnly() {
			t.Errorf("%s: ports %v, want only 127.0.0.1:%d:%d", name, s.Ports, want.port, want.port)
		}
		for _, m := range s.mounts() {
			if !m.readOnly {
				t.Errorf("%s: %s is mounted read-write", name, m.source)
			}
			if _, err := os.Stat(filepath.Join(repoRoot, m.source)); err != nil {
				t.Errorf("%s: mounts %s: %v", name, m.source, err)
			}
		}
	}

	prom := f.Services["prometheus"]
	configFile, ok := prom.commandFlag("config.file")
	if !ok {
		configFile = "/etc/prometheus/prometheus.yml" // the image's default
	}
	if m, ok := prom.mountOf(prometheusConfigPath); !ok || m.target != configFile {
		t.Errorf("prometheus: %s is not mounted at the --config.file %s (mounts %v)", prometheusConfigPath, configFile, prom.mounts())
	}

	graf := f.Services["grafana"]
	env := graf.env()
	if env["GF_AUTH_ANONYMOUS_ENABLED"] != "true" || env["GF_AUTH_ANONYMOUS_ORG_ROLE"] != "Viewer" {
		t.Errorf("grafana: anonymous access %q as %q, want true as Viewer",
			env["GF_AUTH_ANONYMOUS_ENABLED"], env["GF_AUTH_ANONYMOUS_ORG_ROLE"])
	}
	if !graf.dependsOn("prometheus") {
		t.Errorf("grafana does not depend on prometheus")
	}
	if m, ok := graf.mountOf(grafanaProvisioning); !ok || m.target != "/etc/grafana/provisioning" {
		t.Errorf("grafana: %s is not mounted at /etc/grafana/provisioning (mounts %v)", grafanaProvisioning, graf.mounts())
	}
	var providers grafanaProviders
	readRepoYAML(t, grafanaProviderPath, &providers, false)
	if len(providers.Providers) != 1 || providers.Providers[0].Type != "file" {
		t.Fatalf("%s: want one provider of type file, got %+v", grafanaProviderPath, providers.Providers)
	}
	dashboards, ok := graf.mountOf(grafanaDashboardsDir)
	if want := providers.Providers[0].Options.Path; !ok || filepath.Clean(dashboards.target) != filepath.Clean(want) {
		t.Errorf("grafana: %s mounted at %q, the provider reads %q", grafanaDashboardsDir, dashboards.target, want)
	}
	if home, ok := env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; ok {
		rel, err := filepath.Rel(dashboards.target, home)
		if err != nil || strings.HasPrefix(rel, "..") {
			t.Errorf("grafana: home dashboard %s is outside the dashboards mount %s", home, dashboards.target)
		} else if _, err := os.Stat(filepath.Join(repoRoot, grafanaDashboardsDir, rel)); err != nil {
			t.Errorf("grafana: home dashboard %s: %v", home, err)
		}
	}
}

// The datasource Grafana is provisioned with: the compose prometheus,
// queried server-side, under the uid lab.json names.
func TestComposeObserveDatasource(t *testing.T) {
	f := loadCompose(t)
	var ds grafanaDatasources
	readRepoYAML(t, grafanaDatasourcePath, &ds, false)
	if len(ds.Datasources) != 1 {
		t.Fatalf("%s: %d datasources, want 1", grafanaDatasourcePath, len(ds.Datasources))
	}
	d := ds.Datasources[0]
	u, err := url.Parse(d.URL)
	if d.Type != "prometheus" || d.UID == "" || d.Access != "proxy" || err != nil ||
		u.Hostname() != "prometheus" || u.Port() != strconv.Itoa(observeServices["prometheus"].port) {
		t.Errorf("datasource %+v: want type prometheus, a fixed uid, access proxy, url http://prometheus:9090", d)
	}
	if _, ok := f.Services[u.Hostname()]; !ok {
		t.Errorf("datasource url %s names no compose service", d.URL)
	}
}

// The scrape configuration, read strictly: a field this struct lacks (say
// a service discovery adding targets) fails the test.
type prometheusConfig struct {
	Global struct {
		ScrapeInterval     string `yaml:"scrape_interval"`
		ScrapeTimeout      string `yaml:"scrape_timeout"`
		EvaluationInterval string `yaml:"evaluation_interval"`
	} `yaml:"global"`
	ScrapeConfigs []struct {
		JobName        string `yaml:"job_name"`
		MetricsPath    string `yaml:"metrics_path"`
		ScrapeInterval string `yaml:"scrape_interval"`
		ScrapeTimeout  string `yaml:"scrape_timeout"`
		StaticConfigs  []struct {
			Targets []string          `yaml:"targets"`
			Labels  map[string]string `yaml:"labels"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

func TestComposeObservePrometheusTargets(t *testing.T) {
	f := loadCompose(t)
	// The replicas as compose.go.yml defines them: the services with a
	// LAB_REPLICA, at the port of their LAB_ADDR.
	var want, names []string
	metricsPath := map[string]bool{}
	for name, s := range f.Services {
		env := s.env()
		if env["LAB_REPLICA"] == "" {
			continue
		}
		_, port, err := net.SplitHostPort(env["LAB_ADDR"])
		if err != nil {
			t.Errorf("%s: LAB_ADDR %q: %v", name, env["LAB_ADDR"], err)
			continue
		}
		names = append(names, name)
		want = append(want, net.JoinHostPort(name, port))
		metricsPath[strings.TrimSuffix(env["LAB_BASE_PATH"], "/")+"/metrics"] = true
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, labReplicas) {
		t.Fatalf("compose services with a LAB_REPLICA: %v, want %v", names, labReplicas)
	}
	if len(metricsPath) != 1 {
		t.Fatalf("the replicas serve /metrics under different base paths: %v", metricsPath)
	}

	var cfg prometheusConfig
	readRepoYAML(t, prometheusConfigPath, &cfg, true)
	var got []string
	for _, job := range cfg.ScrapeConfigs {
		if path := firstSet(job.MetricsPath, "/metrics"); !metricsPath[path] {
			t.Errorf("job %s scrapes %s, the replicas serve %v", job.JobName, path, metricsPath)
		}
		if every := firstSet(job.ScrapeInterval, cfg.Global.ScrapeInterval); every != "5s" {
			t.Errorf("job %s scrapes every %q, want 5s", job.JobName, every)
		}
		for _, sc := range job.StaticConfigs {
			got = append(got, sc.Targets...)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("%s scrapes %v, want the replicas %v", prometheusConfigPath, got, want)
	}
}

// firstSet is the first non-empty string.
func firstSet(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// --- lab.json

type dashboardRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashboardPanel struct {
	ID         int           `json:"id"`
	Type       string        `json:"type"`
	Title      string        `json:"title"`
	Datasource *dashboardRef `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string        `json:"refId"`
		Expr       string        `json:"expr"`
		Datasource *dashboardRef `json:"datasource"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"` // a collapsed row's
}

type dashboard struct {
	UID           string           `json:"uid"`
	Title         string           `json:"title"`
	SchemaVersion int              `json:"schemaVersion"`
	Refresh       string           `json:"refresh"`
	Panels        []dashboardPanel `json:"panels"`
}

func loadDashboard(t *testing.T) (dashboard, []dashboardPanel) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, dashboardPath))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var flat []dashboardPanel
	for _, p := range d.Panels {
		flat = append(flat, p)
		flat = append(flat, p.Panels...)
	}
	return d, flat
}

var (
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	promqlNumber   = regexp.MustCompile(`\b[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?(?:(?:ms|[smhdwy])(?:[0-9]+(?:ms|[smhdwy]))*)?\b`) // and durations
	promqlIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	promqlSelector = regexp.MustCompile(`([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}`)
	promqlMatcher  = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
)

// promqlFuncs are the functions and aggregations an expression may call;
// one outside this list is a typo or needs adding here.
var promqlFuncs = []string{"sum", "max", "min", "avg", "count", "topk", "bottomk", "rate", "irate", "increase",
	"delta", "deriv", "histogram_quantile", "vector", "scalar", "clamp_min", "clamp_max", "abs", "time",
	"max_over_time", "min_over_time", "avg_over_time", "label_replace"}

var promqlKeywords = []string{"and", "or", "unless", "bool", "offset"}

// promqlMetrics returns the metric names of a PromQL expression (Grafana's
// $__variables may stand in range selectors), and the names it calls that
// are no known function.
func promqlMetrics(expr string) (metrics, unknown []string) {
	s := promqlString.ReplaceAllString(expr, `""`)
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlRange.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	s = promqlNumber.ReplaceAllString(s, " ")
	for _, m := range promqlIdent.FindAllStringSubmatch(s, -1) {
		name := strings.TrimSpace(strings.TrimSuffix(m[0], "("))
		switch {
		case m[1] != "":
			if !slices.Contains(promqlFuncs, name) {
				unknown = append(unknown, name)
			}
		case slices.Contains(promqlKeywords, name):
		default:
			metrics = append(metrics, name)
		}
	}
	return metrics, unknown
}

func TestComposeObservePromqlParser(t *testing.T) {
	m, u := promqlMetrics(`histogram_quantile(0.99, sum by (store, le) (rate(a_bucket{x="{y}"}[$__rate_interval]))) or vector(1e3) / b_total offset 1h30m`)
	if !slices.Equal(m, []string{"a_bucket", "b_total"}) || len(u) != 0 {
		t.Errorf("metrics %v, unknown functions %v", m, u)
	}
	if _, u := promqlMetrics(`sum(rat(a[5m]))`); !slices.Equal(u, []string{"rat"}) {
		t.Errorf("unknown functions %v, want [rat]", u)
	}
}

func TestComposeObserveDashboard(t *testing.T) {
	var ds grafanaDatasources
	readRepoYAML(t, grafanaDatasourcePath, &ds, false)
	if len(ds.Datasources) == 0 || ds.Datasources[0].UID == "" {
		t.Fatalf("%s: no datasource uid", grafanaDatasourcePath)
	}
	uid := ds.Datasources[0].UID

	d, panels := loadDashboard(t)
	if d.Title != dashboardTitle || d.UID == "" || d.Refresh != "5s" || d.SchemaVersion < 36 || d.SchemaVersion > 41 {
		t.Errorf("dashboard title %q, uid %q, refresh %q, schemaVersion %d; want %q, a uid, 5s, ~39",
			d.Title, d.UID, d.Refresh, d.SchemaVersion, dashboardTitle)
	}

	used := map[string]int{}
	ids := map[int]bool{}
	var exprs int
	var statOutcomes []string
	for _, p := range panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		switch p.Type {
		case "row":
			continue
		case "timeseries", "stat":
		default:
			t.Errorf("panel %q: type %q, want timeseries or stat", p.Title, p.Type)
		}
		if p.Datasource == nil || p.Datasource.UID != uid || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: datasource %+v, want the provisioned prometheus %s", p.Title, p.Datasource, uid)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		inPanel := map[string]bool{}
		for _, q := range p.Targets {
			if q.Datasource != nil && q.Datasource.UID != uid {
				t.Errorf("panel %q, query %s: datasource uid %q, want %q", p.Title, q.RefID, q.Datasource.UID, uid)
			}
			metrics, unknown := promqlMetrics(q.Expr)
			if len(metrics) == 0 {
				t.Errorf("panel %q, query %s: %q names no metric", p.Title, q.RefID, q.Expr)
			}
			for _, f := range unknown {
				t.Errorf("panel %q: %q calls %s, not a known PromQL function (promqlFuncs)", p.Title, q.Expr, f)
			}
			for _, m := range metrics {
				if _, ok := labMetrics[m]; !ok {
					t.Errorf("panel %q: %q uses %s, not a lab metric of the contract (labMetrics)", p.Title, q.Expr, m)
				}
				used[m]++
				inPanel[m] = true
			}
			checkPromqlLabels(t, p.Title, q.Expr, metrics)
			if p.Type == "stat" {
				for _, sel := range promqlSelector.FindAllStringSubmatch(q.Expr, -1) {
					for _, m := range promqlMatcher.FindAllStringSubmatch(sel[2], -1) {
						if sel[1] == "lab_webhooks_total" && m[1] == "outcome" && m[2] == "=" {
							statOutcomes = append(statOutcomes, m[3])
						}
					}
				}
			}
			exprs++
		}
		if inPanel["lab_charge_rollbacks_total"] && inPanel["lab_charge_crashes_total"] {
			t.Errorf("panel %q shows rollbacks and crashes together: show them apart", p.Title)
		}
	}
	for m := range labMetrics {
		if used[m] == 0 {
			t.Errorf("%s is charted nowhere in %s", m, dashboardPath)
		}
	}
	if exprs < len(labMetrics) {
		t.Errorf("%d queries in %s, want at least one per contract metric (%d)", exprs, dashboardPath, len(labMetrics))
	}
	for _, o := range []string{"bad_signature", "duplicate"} {
		if !slices.Contains(statOutcomes, o) {
			t.Errorf("no stat panel for webhooks with outcome %s", o)
		}
	}
	checkQuantiles(t, panels)
	checkLayout(t, panels)
}

// checkPromqlLabels: matchers name labels the metric has, outcome values are
// those of the contract, and grouping labels are on every metric grouped.
func checkPromqlLabels(t *testing.T, title, expr string, metrics []string) {
	t.Helper()
	for _, sel := range promqlSelector.FindAllStringSubmatch(expr, -1) {
		labels, ok := labMetrics[sel[1]]
		if !ok {
			continue // reported by the caller
		}
		for _, m := range promqlMatcher.FindAllStringSubmatch(sel[2], -1) {
			if !slices.Contains(labels, m[1]) && !slices.Contains(targetLabels, m[1]) {
				t.Errorf("panel %q: %s has no label %s", title, sel[1], m[1])
				continue
			}
			allowed, named := labOutcomes[sel[1]]
			if m[1] != "outcome" || !named {
				continue
			}
			values := []string{m[3]}
			if strings.HasSuffix(m[2], "~") {
				values = strings.Split(m[3], "|")
			}
			for _, v := range values {
				if !slices.Contains(allowed, v) {
					t.Errorf("panel %q: %s{outcome %s %q}: %q is not one of %v", title, sel[1], m[2], m[3], v, allowed)
				}
			}
		}
	}
	for _, g := range promqlGrouping.FindAllStringSubmatch(promqlString.ReplaceAllString(expr, `""`), -1) {
		for l := range strings.SplitSeq(g[1], ",") {
			l = strings.TrimSpace(l)
			if l == "" || slices.Contains(targetLabels, l) {
				continue
			}
			for _, m := range metrics {
				if labels, ok := labMetrics[m]; ok && !slices.Contains(labels, l) {
					t.Errorf("panel %q: %q groups by %s, which %s does not have", title, expr, l, m)
				}
			}
		}
	}
}

// checkQuantiles: p50 and p99 of the charge duration, by store and outcome.
func checkQuantiles(t *testing.T, panels []dashboardPanel) {
	t.Helper()
	quantile := regexp.MustCompile(`^histogram_quantile\(\s*([0-9.]+)\s*,\s*sum by \(([^)]*)\)\s*\(rate\(lab_charge_duration_seconds_bucket\[`)
	found := map[string]bool{}
	for _, p := range panels {
		for _, q := range p.Targets {
			m := quantile.FindStringSubmatch(q.Expr)
			if m == nil {
				continue
			}
			var by []string
			for l := range strings.SplitSeq(m[2], ",") {
				by = append(by, strings.TrimSpace(l))
			}
			slices.Sort(by)
			if !slices.Equal(by, []string{"le", "outcome", "store"}) {
				t.Errorf("panel %q: %q groups by %v, want store, outcome and le", p.Title, q.Expr, by)
			}
			found[m[1]] = true
		}
	}
	for _, q := range []string{"0.5", "0.99"} {
		if !found[q] {
			t.Errorf("no histogram_quantile(%s, …) of lab_charge_duration_seconds_bucket", q)
		}
	}
}

// checkLayout: every panel inside the 24 columns, none overlapping.
func checkLayout(t *testing.T, panels []dashboardPanel) {
	t.Helper()
	for i, a := range panels {
		g := a.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", a.Title, g)
		}
		for _, b := range panels[i+1:] {
			h := b.GridPos
			if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				t.Errorf("panels %q and %q overlap", a.Title, b.Title)
			}
		}
	}
}

// TestComposeProvider: one provider serves every replica, with the secret
// they verify its webhooks with and the API key they call it with (neither
// with a default written in the file), and calls them back through the
// front.
func TestComposeProvider(t *testing.T) {
	f := loadCompose(t)
	p, ok := f.Services["provider"]
	if !ok {
		t.Fatal("service provider missing")
	}
	if cmd, _ := p.Command.([]any); len(cmd) == 0 || cmd[0] != "provider" {
		t.Errorf("provider runs %v, want the lab binary's provider command", p.Command)
	}
	penv := p.env()
	if u, err := url.Parse(penv["LAB_WEBHOOK_URL"]); err != nil || u.Hostname() != "front" || u.Path != "/webhooks/provider" {
		t.Errorf("provider: LAB_WEBHOOK_URL = %q, want the front's /webhooks/provider", penv["LAB_WEBHOOK_URL"])
	}
	for _, k := range []string{"LAB_WEBHOOK_SECRET", "LAB_PROVIDER_API_KEY"} {
		if v := penv[k]; !strings.HasPrefix(v, "${"+k+":?") || !strings.HasSuffix(v, "}") {
			t.Errorf("provider: %s = %q, want ${%s:?…}: required, with no default", k, v, k)
		}
	}
	for _, name := range labReplicas {
		s := f.Services[name]
		env := s.env()
		if u, err := url.Parse(env["LAB_PROVIDER_URL"]); err != nil || u.Hostname() != "provider" || u.Port() != "8617" {
			t.Errorf("%s: LAB_PROVIDER_URL = %q, want the provider service", name, env["LAB_PROVIDER_URL"])
		}
		for _, k := range []string{"LAB_WEBHOOK_SECRET", "LAB_PROVIDER_API_KEY"} {
			if env[k] != penv[k] {
				t.Errorf("%s: %s differs from the provider's", name, k)
			}
		}
		if !s.waitsHealthy("provider") {
			t.Errorf("%s does not wait for the provider to be healthy", name)
		}
	}
}

// TestComposeRedisPair: every replica fails over the same primary and
// replica pair, which replicates, and waits for it.
func TestComposeRedisPair(t *testing.T) {
	f := loadCompose(t)
	replica, ok := f.Services["redis-pair-replica"]
	if _, primary := f.Services["redis-pair-primary"]; !ok || !primary {
		t.Fatal("the redis-pair services are missing")
	}
	if cmd := fmt.Sprint(replica.Command); !strings.Contains(cmd, "--replicaof redis-pair-primary 6379") {
		t.Errorf("redis-pair-replica runs %s, want it replicating redis-pair-primary", cmd)
	}
	for _, name := range labReplicas {
		s := f.Services[name]
		env := s.env()
		for k, host := range map[string]string{"LAB_REDIS_PAIR_PRIMARY": "redis-pair-primary", "LAB_REDIS_PAIR_REPLICA": "redis-pair-replica"} {
			if u, err := url.Parse(env[k]); err != nil || u.Hostname() != host {
				t.Errorf("%s: %s = %q, want the %s service", name, k, env[k], host)
			}
		}
		if !s.waitsHealthy("redis-pair-replica") {
			t.Errorf("%s does not wait for the Redis pair", name)
		}
	}
}
