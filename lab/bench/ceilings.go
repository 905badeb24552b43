package bench

import (
	"bytes"
	"context"
	"embed"
	"encoding/csv"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	goredis "github.com/redis/go-redis/v9"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/httpserve"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

// pgbenchSQL holds the postgres store's statements as pgbench scripts;
// scripts/pgbench.sh runs the same files.
//
//go:embed pgbench/*.sql
var pgbenchSQL embed.FS

// Ceiling is a figure the lab's paths are compared with.
type Ceiling struct {
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Tool      string  `json:"tool"`
	Round     int     `json:"round"`
	PerSec    float64 `json:"per_s,omitempty"`
	LatencyMS float64 `json:"latency_avg_ms,omitempty"`
	P50MS     float64 `json:"p50_ms,omitempty"`
	P99MS     float64 `json:"p99_ms,omitempty"`
	// Status is "measured", or why there is no figure.
	Status  string `json:"status"`
	Command string `json:"command,omitempty"`
	// Stats are the bare Echo handler's vegeta figures.
	Stats *Stats `json:"stats,omitempty"`
}

// Measured is the status of a ceiling with a figure.
const Measured = "measured"

// Ceiling ids.
const (
	PgFreshHot  = "pgbench_fresh_hot"
	PgFreshMany = "pgbench_fresh_many"
	PgReplay    = "pgbench_replay"
	PgSelect    = "pgbench_pk_select"
	RedisGet    = "redis_get"
	RedisSetNX  = "redis_set_nx"
	EchoBare    = "echo"
)

// pgbenchScript is one embedded script, the variables it runs with, and
// the ceiling it measures.
type pgbenchScript struct {
	id, file, name string
	defines        []string // pgbench -D name=value
}

func pgbenchScripts() []pgbenchScript {
	return []pgbenchScript{
		{PgFreshHot, "fresh.sql", "pgbench fresh (hot account)", []string{"accounts=1"}},
		{PgFreshMany, "fresh.sql", "pgbench fresh (" + thousands(Accounts) + " accounts)", []string{"accounts=" + strconv.Itoa(Accounts)}},
		{PgReplay, "replay.sql", "pgbench replay statements", nil},
		{PgSelect, "pk_select.sql", "pgbench PK select", nil},
	}
}

// ceilingSteps are the ceilings a store's paths are compared with, run
// right after them so both meet the machine in the same state: the bare
// Echo handler after memory, pgbench after postgres, redis-benchmark
// after redis.
func (b *bencher) ceilingSteps(store lab.StoreName, round int) []step {
	measure := func(label string, f func(ctx context.Context) ([]*Ceiling, error)) []step {
		return []step{{label: "ceiling: " + label + roundSuffix(round, b.cfg.Repeat), run: func(ctx context.Context) error {
			if _, _, err := b.settle(ctx); err != nil {
				return err
			}
			cs, err := f(ctx)
			for _, c := range cs {
				c.Round = round
			}
			b.res.Ceilings = append(b.res.Ceilings, cs...)
			if err == nil {
				err = ctx.Err()
			}
			return err
		}}}
	}
	switch store {
	case "memory":
		if b.cfg.Echo {
			return b.echoStep(round)
		}
	case "postgres":
		return measure("pgbench", func(ctx context.Context) ([]*Ceiling, error) { return b.pgbench(ctx), nil })
	case "redis":
		return measure("redis-benchmark", func(ctx context.Context) ([]*Ceiling, error) { return b.redisBenchmark(ctx), nil })
	}
	return nil
}

// echoStep measures the bare Echo handler.
func (b *bencher) echoStep(round int) []step {
	return []step{{label: "ceiling: bare Echo handler" + roundSuffix(round, b.cfg.Repeat), run: func(ctx context.Context) error {
		if _, _, err := b.settle(ctx); err != nil {
			return err
		}
		c, err := b.echoCeiling(ctx)
		c.Round = round
		b.res.Ceilings = append(b.res.Ceilings, c)
		return err
	}}}
}

// unmeasured returns the ceilings named, each with why it has no figure.
func unmeasured(status, tool string, ids ...[2]string) []*Ceiling {
	out := make([]*Ceiling, 0, len(ids))
	for _, id := range ids {
		out = append(out, &Ceiling{ID: id[0], Name: id[1], Tool: tool, Status: status})
	}
	return out
}

// echoCeiling loads an Echo server that does nothing but answer what a
// replay answers, exactly as the lab is loaded: the HTTP ceiling.
func (b *bencher) echoCeiling(ctx context.Context) (*Ceiling, error) {
	c := &Ceiling{ID: EchoBare, Name: "bare Echo handler", Tool: "echo + vegeta"}
	body := b.replayBody
	if body == nil { // memory's replay was not loaded: a charge of the same shape
		body = lab.ChargeResponse(lab.Charge{ID: "ch_bench", Account: "acct-1", AmountCents: 2500, Currency: "USD", BalanceCents: 2500, CreatedAt: time.Now().UTC()}).Body
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.POST("/charges", func(c echo.Context) error {
		c.Response().Header().Set("Idempotent-Replayed", "true")
		return c.Blob(http.StatusCreated, echo.MIMEApplicationJSON, body)
	})
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		c.Status = "failed: " + err.Error()
		return c, nil
	}
	srv := httpserve.New(e, httpserve.DefaultTimeouts())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-served
	}()
	u := "http://" + ln.Addr().String() + "/charges?store=memory"
	r := request{store: "memory", token: b.cfg.Lab.Token, run: "bench-" + b.cfg.ID + "-echo", key: "bench-" + b.cfg.ID + "-echo", account: "acct-1"}
	var n atomic.Uint64
	tr := func(t *vegeta.Target) error {
		n.Add(1)
		t.Method, t.URL, t.Body, t.Header = http.MethodPost, u, chargeBody(r.account), r.header()
		return nil
	}
	var s Stats
	if err := b.attack(ctx, tr, "echo", vegeta.Rate{}, b.cfg.Duration, &s, nil); err != nil {
		return c, err
	}
	c.Stats, c.PerSec, c.P50MS, c.P99MS, c.LatencyMS, c.Status = &s, s.Throughput, s.Latency.P50, s.Latency.P99, s.Latency.Mean, Measured
	return c, nil
}

// seconds is the phase duration in whole seconds, at least one, as
// pgbench -T takes it.
func (b *bencher) seconds() int {
	return max(1, int((b.cfg.Duration+time.Second-1)/time.Second))
}

var (
	pgbenchTPS     = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
	pgbenchLatency = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
)

// pgbench runs the postgres store's statements in a scratch schema of
// their own, created and dropped here, with as many clients as the lab
// had connections.
func (b *bencher) pgbench(ctx context.Context) []*Ceiling {
	var ids [][2]string
	for _, s := range pgbenchScripts() {
		ids = append(ids, [2]string{s.id, s.name})
	}
	bin, err := exec.LookPath("pgbench")
	switch {
	case err != nil:
		return unmeasured("not installed", "pgbench", ids...)
	case b.cfg.DatabaseURL == "":
		return unmeasured("needs DATABASE_URL", "pgbench", ids...)
	case !b.cfg.External:
		return unmeasured("not measured (-ceilings=false or -smoke)", "pgbench", ids...)
	}
	fail := func(err error) []*Ceiling { return unmeasured("failed: "+err.Error(), "pgbench", ids...) }
	schema := "idempotency_lab_pgbench_" + b.cfg.ID
	pool, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: b.cfg.DatabaseURL, Schema: schema, Size: 1, AppName: "idempotency-lab-bench", Migrate: true})
	if err != nil {
		return fail(err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = pgdb.DropSchema(dctx, pool, schema)
		pool.Close()
	}()
	seed, err := pgbenchSQL.ReadFile("pgbench/seed.sql")
	if err != nil {
		return fail(err)
	}
	if _, err := pool.Exec(ctx, string(seed)); err != nil {
		return fail(fmt.Errorf("error seeding the replayed key: %w", err))
	}
	dir, err := os.MkdirTemp("", "lab-pgbench-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	clients := strconv.Itoa(b.cfg.Connections)
	var out []*Ceiling
	for _, s := range pgbenchScripts() {
		c := &Ceiling{ID: s.id, Name: s.name, Tool: "pgbench"}
		out = append(out, c)
		sql, err := pgbenchSQL.ReadFile("pgbench/" + s.file)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, s.file), sql, 0o600)
		}
		if err != nil {
			c.Status = "failed: " + err.Error()
			continue
		}
		// -M prepared: pgx, the lab's driver, prepares and caches its statements too.
		args := []string{"-n", "-M", "prepared", "-c", clients, "-j", clients, "-T", strconv.Itoa(b.seconds()),
			"-D", "tenant=acme", "-D", "endpoint=POST /charges", "-D", "key=replayed"}
		for _, d := range s.defines {
			args = append(args, "-D", d)
		}
		args = append(args, "-f", filepath.Join(dir, s.file), b.cfg.DatabaseURL)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "PGOPTIONS=-c search_path="+schema)
		c.Command = "pgbench " + shellJoin(args[:len(args)-3]) + " -f lab/bench/pgbench/" + s.file + " \"$DATABASE_URL\" (search_path: a scratch schema, as scripts/pgbench.sh)"
		output, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			return out
		}
		tps, lat := pgbenchTPS.FindSubmatch(output), pgbenchLatency.FindSubmatch(output)
		if err != nil || tps == nil {
			c.Status = "failed: " + lastLine(output, err)
			continue
		}
		c.PerSec, _ = strconv.ParseFloat(string(tps[1]), 64)
		if lat != nil {
			c.LatencyMS, _ = strconv.ParseFloat(string(lat[1]), 64)
		}
		c.Status = Measured
	}
	return out
}

// lastLine is the last non-empty line of a tool's output, or err.
func lastLine(output []byte, err error) string {
	lines := strings.Split(strings.TrimSpace(string(output)), "\n")
	if l := strings.TrimSpace(lines[len(lines)-1]); l != "" {
		return l
	}
	if err != nil {
		return err.Error()
	}
	return "no figure in its output"
}

// redisBenchmark measures the redis store's replay command, SET NX on a
// key that holds a stored response (it changes nothing), and a plain GET of
// it, on the lab's Redis, with as many clients as the lab had connections.
func (b *bencher) redisBenchmark(ctx context.Context) []*Ceiling {
	ids := [][2]string{{RedisSetNX, "redis-benchmark SET NX (key exists)"}, {RedisGet, "redis-benchmark GET"}}
	bin, err := exec.LookPath("redis-benchmark")
	switch {
	case err != nil:
		return unmeasured("not installed", "redis-benchmark", ids...)
	case b.cfg.RedisURL == "":
		return unmeasured("needs REDIS_URL (the embedded Redis is miniredis, inside the lab's process)", "redis-benchmark", ids...)
	case !b.cfg.External:
		return unmeasured("not measured (-ceilings=false or -smoke)", "redis-benchmark", ids...)
	}
	fail := func(err error) []*Ceiling { return unmeasured("failed: "+err.Error(), "redis-benchmark", ids...) }
	opts, err := goredis.ParseURL(b.cfg.RedisURL)
	if err != nil {
		return fail(fmt.Errorf("error parsing REDIS_URL: %w", err))
	}
	host, port, err := net.SplitHostPort(opts.Addr)
	if err != nil {
		return fail(fmt.Errorf("error reading REDIS_URL's address: %w", err))
	}
	client := goredis.NewClient(opts)
	defer client.Close()
	key := b.cfg.RedisPrefix + "bench-" + b.cfg.ID + ":replayed"
	value := b.replayBody
	if value == nil {
		value = []byte(`{"id":"ch_bench","account":"acct-1","amount_cents":2500,"currency":"USD","balance_cents":2500,"created_at":"2026-01-01T00:00:00Z"}`)
	}
	if err := client.Set(ctx, key, value, 10*time.Minute).Err(); err != nil {
		return fail(fmt.Errorf("error seeding %s: %w", key, err))
	}
	defer client.Del(context.WithoutCancel(ctx), key)
	base := []string{"-h", host, "-p", port, "--dbnum", strconv.Itoa(opts.DB), "-c", strconv.Itoa(b.cfg.Connections), "--csv"}
	shown := strings.Join(base, " ")
	if opts.Password != "" {
		base = append(base, "-a", opts.Password, "--no-auth-warning")
		shown += " -a …"
		if opts.Username != "" {
			base = append(base, "--user", opts.Username)
		}
	}
	if opts.TLSConfig != nil {
		base = append(base, "--tls")
		shown += " --tls"
	}
	run := func(n int, command ...string) (*Ceiling, error) {
		args := append(append(append([]string{}, base...), "-n", strconv.Itoa(n)), command...)
		output, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		c := &Ceiling{Tool: "redis-benchmark", Command: "redis-benchmark " + shown + " -n " + strconv.Itoa(n) + " " + shellJoin(command)}
		if err != nil {
			return c, errors.New(lastLine(output, err))
		}
		return c, parseRedisCSV(output, c)
	}
	// A short run says how many requests last about a phase.
	probe, err := run(20000, "GET", key)
	if err != nil {
		return fail(err)
	}
	n := max(20000, int(probe.PerSec*b.cfg.Duration.Seconds()))
	var out []*Ceiling
	for _, m := range []struct {
		id, name string
		command  []string
	}{
		{RedisSetNX, ids[0][1], []string{"SET", key, "x", "NX"}},
		{RedisGet, ids[1][1], []string{"GET", key}},
	} {
		c, err := run(n, m.command...)
		c.ID, c.Name = m.id, m.name
		if err != nil {
			c.Status = "failed: " + err.Error()
		}
		out = append(out, c)
		if ctx.Err() != nil {
			break
		}
	}
	return out
}

// parseRedisCSV reads redis-benchmark --csv: a header, then one line per
// test, "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",
// "p95_latency_ms","p99_latency_ms","max_latency_ms" (older versions stop
// after rps).
func parseRedisCSV(output []byte, c *Ceiling) error {
	r := csv.NewReader(bytes.NewReader(output))
	r.FieldsPerRecord = -1
	records, err := r.ReadAll()
	if err != nil {
		return fmt.Errorf("error reading redis-benchmark's CSV: %w", err)
	}
	for _, rec := range records {
		if len(rec) < 2 || rec[0] == "test" {
			continue
		}
		num := func(i int) float64 {
			if i >= len(rec) {
				return 0
			}
			v, _ := strconv.ParseFloat(rec[i], 64)
			return v
		}
		c.PerSec, c.LatencyMS, c.P50MS, c.P99MS = num(1), num(2), num(4), num(6)
		if c.PerSec <= 0 {
			return fmt.Errorf("no rate in redis-benchmark's line %q", strings.Join(rec, ","))
		}
		c.Status = Measured
		return nil
	}
	return fmt.Errorf("no result in redis-benchmark's output: %q", output)
}

// shellJoin writes args as a POSIX shell would read them back.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`*?[]{}()<>|&;#~!") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}
