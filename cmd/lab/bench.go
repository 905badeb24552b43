package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/bench"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/pgdb/throwaway"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/variant"
)

// benchFlags are lab bench's own flags, beside serve's.
type benchFlags struct {
	duration    time.Duration
	connections int
	stores      string
	replicas    string
	ceilings    bool
	json        string
	markdown    bool
	smoke       bool
	attemptRuns int
	repeat      int
	sustained   string
	search      int
	cpuProfile  string
}

// runBench loads a lab of its own (started with the same configuration as
// serve, on a free loopback port) path by path, holds every loaded phase to
// the ledger and prints one table beside the ceilings measured in the same
// run. A failed ledger check fails the command.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	id := bench.NewID()
	m := NewMain(stderr)
	// Its rows and keys go to a scratch schema and Redis prefix of its own,
	// removed at the end, unless -pg-schema / -redis-prefix name others.
	scratchSchema, scratchPrefix := "idempotency_lab_bench_"+id, "idempotency-lab-bench-"+id+":"
	m.Config.PGSchema, m.Config.RedisPrefix = scratchSchema, scratchPrefix
	m.Config.RedisPair = false // only the failover fault needs the pair: not worth two redis-servers here
	fs, err := m.flags("lab bench")
	if err != nil {
		return err
	}
	var f benchFlags
	fs.DurationVar(&f.duration, "duration", 5*time.Second, "length of each loaded phase and ceiling")
	fs.IntVar(&f.connections, "connections", 16, "concurrent requests, each on a kept-alive connection (pgbench and redis-benchmark clients too)")
	fs.StringVar(&f.stores, "stores", "", "stores to load, comma-separated (default every registered store; memory,unsafe with -smoke)")
	fs.StringVar(&f.replicas, "replicas", "1,3", "replica counts each store is loaded on, comma-separated")
	fs.BoolVar(&f.ceilings, "ceilings", true, "measure the ceilings: a bare Echo handler, and pgbench and redis-benchmark when installed")
	fs.StringVar(&f.json, "json", "", "write every figure as JSON to this file")
	fs.BoolVar(&f.markdown, "markdown", false, "print the table as markdown for a README, after the command line that reproduces it")
	fs.BoolVar(&f.smoke, "smoke", false, "a very short run: 300ms phases, memory and unsafe unless -stores, only the Echo ceiling, 2 runs of 64 attempts, one sustained step at half the fresh throughput")
	fs.IntVar(&f.attemptRuns, "attempt-runs", 9, "64-attempt lab runs per store, for their median wall time and barrier spread")
	fs.IntVar(&f.repeat, "repeat", 1, "rounds: run every phase, ceiling and 64-attempt run this many times, one round after the other, and report medians and spreads")
	fs.StringVar(&f.sustained, "sustained", "0.5,0.8,1.0", "rates of each keyed store's sustained phase (fresh charges with the outbox relay running, its lag sampled), as fractions of the store's fresh (1,000 accounts) throughput in the same run, comma-separated; off: none (0.5 with -smoke)")
	fs.IntVar(&f.search, "sustained-search", 3, "steps of each keyed store's sustained phase after the fractions, searching for the highest rate whose outbox lag p99 stays under 1s (from the relay's drain rate when no fraction held); 0: none (0 with -smoke)")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (the lab, its load generator and its clients) to this file, for go tool pprof")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	if f.smoke {
		if !given["duration"] {
			f.duration = 300 * time.Millisecond
		}
		if !given["stores"] {
			f.stores = "memory,unsafe"
		}
		if !given["attempt-runs"] {
			f.attemptRuns = 2
		}
		if !given["sustained"] {
			f.sustained = "0.5"
		}
		if !given["sustained-search"] {
			f.search = 0
		}
	}
	stores, err := parseStores(f.stores, m.Config.Variants)
	if err != nil {
		return err
	}
	replicas, err := parseCounts(f.replicas)
	if err != nil {
		return err
	}
	sustained, err := parseFractions(f.sustained)
	if err != nil {
		return err
	}
	switch {
	case f.search < 0 || f.search > 10:
		return fmt.Errorf("-sustained-search must be in 0..10 (got %d)", f.search)
	case f.duration <= 0:
		return fmt.Errorf("-duration must be positive (got %s)", f.duration)
	case f.connections < 1 || f.connections > 1024:
		return fmt.Errorf("-connections must be in 1..1024 (got %d)", f.connections)
	case f.attemptRuns < 0:
		return fmt.Errorf("-attempt-runs must not be negative (got %d)", f.attemptRuns)
	case f.repeat < 1 || f.repeat > 50:
		return fmt.Errorf("-repeat must be in 1..50 (got %d)", f.repeat)
	}
	external := f.ceilings && !f.smoke
	// One namespace may hold a quarter of a replica's pool, so that one
	// attendee never starves another: size the pool so the bench's namespace
	// may use as many connections as pgbench has clients, unless told
	// otherwise. Connections open as needed and are dropped between phases.
	if !given["pg-pool-size"] && os.Getenv("LAB_PG_POOL_SIZE") == "" {
		m.Config.PGPoolSize = min(500, max(m.Config.PGPoolSize, 4*f.connections))
	}

	level := m.LogLevel
	if level == "info" {
		level = "warn" // the progress is the output here
	}
	bar := &progressLine{w: stderr, tty: isTerminal(stderr)}
	log, err := newLogger(bar, level)
	if err != nil {
		return err
	}
	m.Config.Logger = log

	// Without DATABASE_URL the lab would start its throwaway cluster out of
	// sight; started here, pgbench can reach the same server.
	embedded := false
	if external && needs(m.Config.Variants, stores, variant.NeedPostgres) {
		var stop func()
		stop, embedded = ownPostgres(ctx, &m.Config, log)
		defer stop()
	}
	defer dropScratch(ctx, m.Config, embedded, scratchSchema, scratchPrefix, log)

	a, stopLab, err := startOwnLab(ctx, m.Config)
	if err != nil {
		return err
	}
	defer stopLab()
	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	pub := a.Public()
	res, err := bench.Run(ctx, bench.Config{
		Lab: bench.Lab{URL: a.URL(), Token: pub.Token, Tenant: pub.Tenant, Namespace: pub.Namespace, Targets: a.Targets, Books: a.Books(),
			QueuedWebhooks: a.QueuedWebhooks,
			Webhooks: func(ctx context.Context, run string) (bench.WebhookCounts, error) {
				st, err := a.Provider().Stats(ctx, provider.Filter{Namespace: string(pub.Namespace), Run: run})
				return bench.WebhookCounts{Queued: int64(st.WebhooksQueued), Delivered: int64(st.WebhooksDelivered)}, err
			},
			DropConnections: a.DropConnections, HoldDelivery: a.HoldDelivery},
		ID: id, Duration: f.duration, Connections: f.connections, Stores: stores, Replicas: replicas,
		Echo: f.ceilings, External: external, DatabaseURL: m.Config.DatabaseURL, RedisURL: m.Config.RedisURL, RedisPrefix: m.Config.RedisPrefix,
		AttemptRuns: f.attemptRuns, Repeat: f.repeat, Sustained: sustained, SustainedSearch: f.search, Command: reproduce("bench", args, os.LookupEnv),
		Progress: func(done, total int, label string) {
			if bar.tty {
				bar.show(done, total, label)
				return
			}
			fmt.Fprintf(bar, "bench: %d/%d %s\n", done, total, label)
		},
	})
	bar.end()
	if err != nil {
		return err
	}
	if f.json != "" {
		if err := writeJSONFile(f.json, res); err != nil {
			return err
		}
	}
	if err := res.WriteTable(stdout, f.markdown); err != nil {
		return err
	}
	if failed := res.Failures(); len(failed) > 0 {
		return fmt.Errorf("bench failed: %s", strings.Join(failed, "; "))
	}
	return nil
}

// parseStores reads -stores; empty means every registered store.
func parseStores(raw string, vs []variant.Variant) ([]lab.StoreName, error) {
	var out []lab.StoreName
	for s := range strings.SplitSeq(raw, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		known := slices.ContainsFunc(vs, func(v variant.Variant) bool { return string(v.Name) == s })
		if !known {
			names := make([]string, len(vs))
			for i, v := range vs {
				names[i] = string(v.Name)
			}
			return nil, fmt.Errorf("-stores: unknown store %q (the lab has %s)", s, strings.Join(names, ", "))
		}
		if !slices.Contains(out, lab.StoreName(s)) {
			out = append(out, lab.StoreName(s))
		}
	}
	return out, nil
}

// parseCounts reads -replicas: positive counts, in the order given.
func parseCounts(raw string) ([]int, error) {
	var out []int
	for s := range strings.SplitSeq(raw, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-replicas: %q is not a positive count", s)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-replicas: at least one count is required (got %q)", raw)
	}
	return out, nil
}

// parseFractions reads -sustained: positive fractions of a throughput, in
// the order given; "off" (or nothing) is none.
func parseFractions(raw string) ([]float64, error) {
	if strings.TrimSpace(raw) == "off" {
		return nil, nil
	}
	var out []float64
	for s := range strings.SplitSeq(raw, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		x, err := strconv.ParseFloat(s, 64)
		if err != nil || !(x > 0 && x <= 4) {
			return nil, fmt.Errorf("-sustained: %q is not a fraction in (0, 4] of the fresh throughput (or off)", s)
		}
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out, nil
}

// needs reports whether one of the chosen stores (every one when none is
// chosen) needs the service.
func needs(vs []variant.Variant, chosen []lab.StoreName, n variant.Need) bool {
	for _, v := range vs {
		if (len(chosen) == 0 || slices.Contains(chosen, v.Name)) && slices.Contains(v.Needs, n) {
			return true
		}
	}
	return false
}

// ownPostgres starts the throwaway PostgreSQL cluster here when the lab
// has no DATABASE_URL and would start one out of sight, so that the
// command can reach the lab's server too; stop stops it.
func ownPostgres(ctx context.Context, c *app.Config, log *slog.Logger) (stop func(), started bool) {
	if c.DatabaseURL != "" || !c.EmbedPostgres {
		return func() {}, false
	}
	if _, err := throwaway.Find(); err != nil {
		return func() {}, false
	}
	cluster, err := throwaway.Start(ctx, log)
	if err != nil {
		return func() {}, false
	}
	c.DatabaseURL = cluster.URL()
	return func() { _ = cluster.Close() }, true
}

// dropScratch removes the scratch schema and Redis prefix a command's lab
// used, unless -pg-schema or -redis-prefix named others; a throwaway
// server's (embedded) go with it.
func dropScratch(ctx context.Context, c app.Config, embedded bool, schema, prefix string, log *slog.Logger) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if c.DatabaseURL != "" && !embedded && c.PGSchema == schema {
		if err := dropSchema(cctx, c.DatabaseURL, schema); err != nil {
			log.Warn("the scratch schema stays", "schema", schema, "err", err)
		}
	}
	if c.RedisURL != "" && c.RedisPrefix == prefix {
		if err := deleteKeys(cctx, c.RedisURL, prefix); err != nil {
			log.Warn("the scratch Redis keys stay", "prefix", prefix, "err", err)
		}
	}
}

func dropSchema(ctx context.Context, dbURL, schema string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("error connecting to drop schema %s: %w", schema, err)
	}
	defer pool.Close()
	return pgdb.DropSchema(ctx, pool, schema)
}

// deleteKeys deletes the keys under prefix, and nothing else.
func deleteKeys(ctx context.Context, redisURL, prefix string) error {
	opts, err := goredis.ParseURL(redisURL)
	if err != nil {
		return fmt.Errorf("error parsing REDIS_URL: %w", err)
	}
	client := goredis.NewClient(opts)
	defer client.Close()
	iter := client.Scan(ctx, 0, prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		if err := client.Unlink(ctx, iter.Val()).Err(); err != nil {
			return fmt.Errorf("error deleting %s: %w", iter.Val(), err)
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("error listing keys under %s: %w", prefix, err)
	}
	return nil
}

func writeJSONFile(path string, res interface{ WriteJSON(io.Writer) error }) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("error creating %s: %w", path, err)
	}
	if err := res.WriteJSON(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("error writing %s: %w", path, err)
	}
	return nil
}

// secretSetting reports the settings whose values a printed command line hides.
func secretSetting(flag string) bool {
	switch flag {
	case "admin-token", "webhook-secret", "join-code", "tenants":
		return true
	}
	return false
}

// reproduce is the command line that runs this bench (or load) again: the lab's
// environment variables that are set, then the arguments, with secrets
// and URL passwords hidden.
func reproduce(command string, args []string, lookup func(string) (string, bool)) string {
	var c app.Config
	var level string
	var parts []string
	secret := map[string]bool{}
	for _, s := range settings(&c, &level) {
		v, ok := lookup(s.env)
		if secretSetting(s.flag) {
			secret["-"+s.flag], secret["--"+s.flag] = true, true
			v = "…"
		}
		if ok && v != "" {
			parts = append(parts, s.env+"="+shellQuote(redactURL(v)))
		}
	}
	parts = append(parts, "go", "run", "./cmd/lab", command)
	hide := false
	for _, a := range args {
		name, _, hasValue := strings.Cut(a, "=")
		switch {
		case hide:
			a, hide = "…", false
		case secret[name] && hasValue:
			a = name + "=…"
		case secret[name]:
			hide = true
		}
		parts = append(parts, shellQuote(redactURL(a)))
	}
	return strings.Join(parts, " ")
}

// redactURL hides the password of a URL (or of a flag=URL argument).
func redactURL(s string) string {
	prefix, raw := "", s
	if name, v, ok := strings.Cut(s, "="); ok && strings.HasPrefix(name, "-") {
		prefix, raw = name+"=", v
	}
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return s
	}
	if _, has := u.User.Password(); !has {
		return s
	}
	return prefix + u.Redacted()
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./:=,@%+-]+$`)

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// startCPUProfile profiles the process into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("error creating %s: %w", path, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("error starting the CPU profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}
