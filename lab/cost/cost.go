// Package cost counts what the lab asks of what it depends on, at the
// drivers: the SQL statements and commits of each PostgreSQL pool (a pgx
// tracer), the Redis round trips (a go-redis hook) and the HTTP requests
// between the lab and its provider. The counts are exposed in /metrics;
// read before and after a batch of operations, they say what one costs.
package cost

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	goredis "github.com/redis/go-redis/v9"
)

// Parties: who sends a statement or a request.
const (
	Lab      = "lab"
	Provider = "provider" // the lab's own simulated provider
)

// Meter holds one process's counts. The zero value is not usable: use New.
type Meter struct {
	mu    sync.Mutex
	sql   map[sqlKey]*SQL
	http  map[httpKey]*atomic.Int64
	redis atomic.Int64

	statements, commits, requests, redisTrips *prometheus.Desc
}

type sqlKey struct {
	party, pool string
	durable     bool
}

type httpKey struct{ direction, route string }

// New returns a meter that counts nothing yet.
func New() *Meter {
	return &Meter{
		sql: map[sqlKey]*SQL{}, http: map[httpKey]*atomic.Int64{},
		statements: prometheus.NewDesc("lab_sql_statements_total",
			"SQL statements sent, BEGIN and COMMIT included, by party (lab or its own provider) and pool.", []string{"party", "pool"}, nil),
		commits: prometheus.NewDesc("lab_sql_commits_total",
			"Commits that wrote: each COMMIT, and each statement outside a transaction that wrote a row. durable=false on a pool whose commits do not wait for the WAL flush.",
			[]string{"party", "pool", "durable"}, nil),
		requests: prometheus.NewDesc("lab_http_requests_total",
			"HTTP requests between the lab and its provider: out, the lab's calls by route; in, the webhooks the lab received.", []string{"direction", "route"}, nil),
		redisTrips: prometheus.NewDesc("lab_redis_round_trips_total",
			"Round trips to Redis: one per command, one per pipeline or transaction.", nil, nil),
	}
}

// SQL counts one pool's statements and commits; it is the pool's tracer
// (pgx.ConnConfig.Tracer). Pools of one party and name share one.
type SQL struct {
	statements, commits atomic.Int64
}

var _ pgx.QueryTracer = (*SQL)(nil)

// SQL returns the counter of party's pool; durable is false for a pool that
// commits asynchronously (synchronous_commit = off).
func (m *Meter) SQL(party, pool string, durable bool) *SQL {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := sqlKey{party, pool, durable}
	if m.sql[k] == nil {
		m.sql[k] = &SQL{}
	}
	return m.sql[k]
}

type autocommitWrite struct{}

// TraceQueryStart counts the statement, and marks one that writes outside
// a transaction: it commits by itself.
func (s *SQL) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.statements.Add(1)
	if conn.PgConn().TxStatus() == 'I' && Writes(d.SQL) {
		return context.WithValue(ctx, autocommitWrite{}, true)
	}
	return ctx
}

// TraceQueryEnd counts a commit: a COMMIT that committed, or a write
// outside a transaction, unless its tag says it wrote no row.
func (s *SQL) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if d.Err != nil {
		return
	}
	tag := d.CommandTag
	switch {
	case tag.String() == "COMMIT":
		s.commits.Add(1)
	case ctx.Value(autocommitWrite{}) != nil && !wroteNothing(tag):
		s.commits.Add(1)
	}
}

func wroteNothing(tag pgconn.CommandTag) bool {
	return (tag.Insert() || tag.Update() || tag.Delete()) && tag.RowsAffected() == 0
}

var (
	sqlComment = regexp.MustCompile(`--[^\n]*`)
	rowLock    = regexp.MustCompile(`(?i)\bfor\s+(no\s+key\s+)?update\b`)
	writeVerb  = regexp.MustCompile(`(?i)\b(insert|update|delete|truncate|merge)\b`)
)

// Writes reports whether a statement's text may write a row: it names
// INSERT, UPDATE, DELETE, TRUNCATE or MERGE outside a comment and a row
// lock (FOR UPDATE).
func Writes(sql string) bool {
	return writeVerb.MatchString(rowLock.ReplaceAllString(sqlComment.ReplaceAllString(sql, ""), ""))
}

// RedisHook counts a client's round trips (goredis.Client.AddHook), not
// those that set a new connection up (HELLO, CLIENT, AUTH, SELECT), which
// go through the hooks too.
func (m *Meter) RedisHook() goredis.Hook { return redisHook{&m.redis} }

type redisHook struct{ n *atomic.Int64 }

func (h redisHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h redisHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if !connectionSetup(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h redisHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) > 0 && !connectionSetup(cmds[0]) {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

func connectionSetup(cmd goredis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select":
		return true
	}
	return false
}

// Received counts one HTTP request the lab received on route, e.g.
// "POST /webhooks/provider".
func (m *Meter) Received(route string) { m.httpCounter("in", route).Add(1) }

func (m *Meter) httpCounter(direction, route string) *atomic.Int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := httpKey{direction, route}
	if m.http[k] == nil {
		m.http[k] = &atomic.Int64{}
	}
	return m.http[k]
}

// Transport counts each request sent through next by its method and its
// route under the provider's base, e.g. "POST /captures": the lab's calls
// to its provider.
func (m *Meter) Transport(next http.RoundTripper) http.RoundTripper {
	return roundTripper{m: m, next: next}
}

type roundTripper struct {
	m    *Meter
	next http.RoundTripper
}

func (t roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	route := r.URL.Path
	if _, under, ok := strings.Cut(route, "/provider/"); ok {
		route, _, _ = strings.Cut(under, "/")
	}
	t.m.httpCounter("out", r.Method+" /"+strings.TrimPrefix(route, "/")).Add(1)
	return t.next.RoundTrip(r)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach next.
func (t roundTripper) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

var _ prometheus.Collector = (*Meter)(nil)

// Describe sends the meter's series' descriptions.
func (m *Meter) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.statements, m.commits, m.requests, m.redisTrips} {
		ch <- d
	}
}

// Collect sends the counts so far. Pools of one party and name that differ
// in durability are summed for the statements.
func (m *Meter) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	statements := map[[2]string]int64{}
	for k, s := range m.sql {
		statements[[2]string{k.party, k.pool}] += s.statements.Load()
		ch <- prometheus.MustNewConstMetric(m.commits, prometheus.CounterValue, float64(s.commits.Load()), k.party, k.pool, durableLabel(k.durable))
	}
	for k, n := range statements {
		ch <- prometheus.MustNewConstMetric(m.statements, prometheus.CounterValue, float64(n), k[0], k[1])
	}
	for k, n := range m.http {
		ch <- prometheus.MustNewConstMetric(m.requests, prometheus.CounterValue, float64(n.Load()), k.direction, k.route)
	}
	ch <- prometheus.MustNewConstMetric(m.redisTrips, prometheus.CounterValue, float64(m.redis.Load()))
}

func durableLabel(d bool) string {
	if d {
		return "true"
	}
	return "false"
}

// Counts is a reading of the meter as /metrics shows it, summed the way
// an operation's cost is told: statements and commits per party, durable
// commits apart from asynchronous ones.
type Counts struct {
	Statements     map[string]float64 `json:"statements"`      // by party
	DurableCommits map[string]float64 `json:"durable_commits"` // by party
	AsyncCommits   map[string]float64 `json:"async_commits"`   // by party
	HTTPOut        map[string]float64 `json:"http_out"`        // the lab's calls to its provider, by route
	HTTPIn         map[string]float64 `json:"http_in"`         // requests the lab received, by route
	RedisTrips     float64            `json:"redis_round_trips"`
}

// Parse reads the meter's series from a /metrics answer in the text
// format; the other series are ignored.
func Parse(r io.Reader) (Counts, error) {
	c := Counts{Statements: map[string]float64{}, DurableCommits: map[string]float64{}, AsyncCommits: map[string]float64{},
		HTTPOut: map[string]float64{}, HTTPIn: map[string]float64{}}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return c, fmt.Errorf("error parsing the metrics: %w", err)
	}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			v := m.GetCounter().GetValue()
			switch name {
			case "lab_sql_statements_total":
				c.Statements[l["party"]] += v
			case "lab_sql_commits_total":
				if l["durable"] == "true" {
					c.DurableCommits[l["party"]] += v
				} else {
					c.AsyncCommits[l["party"]] += v
				}
			case "lab_http_requests_total":
				if l["direction"] == "in" {
					c.HTTPIn[l["route"]] += v
				} else {
					c.HTTPOut[l["route"]] += v
				}
			case "lab_redis_round_trips_total":
				c.RedisTrips += v
			}
		}
	}
	return c, nil
}

// Per is what happened between before and c, per one of n operations.
func (c Counts) Per(before Counts, n int) Counts {
	d := max(float64(n), 1)
	per := func(now, was map[string]float64) map[string]float64 {
		out := map[string]float64{}
		for k, v := range now {
			if x := (v - was[k]) / d; x != 0 {
				out[k] = x
			}
		}
		return out
	}
	return Counts{
		Statements: per(c.Statements, before.Statements), DurableCommits: per(c.DurableCommits, before.DurableCommits),
		AsyncCommits: per(c.AsyncCommits, before.AsyncCommits), HTTPOut: per(c.HTTPOut, before.HTTPOut), HTTPIn: per(c.HTTPIn, before.HTTPIn),
		RedisTrips: (c.RedisTrips - before.RedisTrips) / d,
	}
}

// Sum adds a count's values up (every party, or every route).
func Sum(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}
