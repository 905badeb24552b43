package cost_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab/cost"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
)

func TestMain(m *testing.M) { os.Exit(labtest.WithServices(m).Run()) }

// read scrapes the meter as /metrics serves it and parses it back.
func read(t *testing.T, m *cost.Meter) cost.Counts {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	c, err := cost.Parse(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSQLCountsStatementsAndTheCommitsThatWrote(t *testing.T) {
	url, schema := labtest.Postgres(t)
	ctx := context.Background()
	m := cost.New()
	pool, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: url, Schema: schema, Size: 1, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS counted (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	traced, err := pgdb.Open(ctx, pgdb.PoolConfig{URL: url, Schema: schema, Size: 1, Tracer: m.SQL(cost.Lab, "books", true)})
	if err != nil {
		t.Fatal(err)
	}
	defer traced.Close()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(traced.Exec(ctx, `INSERT INTO counted VALUES (1)`))                                  // 1 statement, a commit
	must(traced.Exec(ctx, `UPDATE counted SET id = 2 WHERE id = 99`))                         // wrote nothing: no commit
	must(traced.Exec(ctx, `SELECT id FROM counted -- an update in a comment writes nothing`)) // a read
	must(nil, traced.QueryRow(ctx, `SELECT id FROM counted FOR UPDATE`).Scan(new(int)))       // a row lock, no transaction
	must(nil, pgx.BeginFunc(ctx, traced, func(tx pgx.Tx) error {                              // BEGIN, 2 statements, COMMIT: one commit
		if _, err := tx.Exec(ctx, `INSERT INTO counted VALUES (3)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO counted VALUES (4)`)
		return err
	}))
	must(traced.Exec(ctx, `WITH moved AS (UPDATE counted SET id = id + 10 WHERE id = 3 RETURNING id) SELECT count(*) FROM moved`))
	c := read(t, m)
	if got := c.Statements[cost.Lab]; got != 9 {
		t.Errorf("statements = %v, want 9", got)
	}
	if got := c.DurableCommits[cost.Lab]; got != 3 {
		t.Errorf("durable commits = %v, want 3 (the insert, the transaction, the CTE's update)", got)
	}
	if len(c.AsyncCommits) != 0 {
		t.Errorf("async commits = %v, want none on a durable pool", c.AsyncCommits)
	}
}

func TestWrites(t *testing.T) {
	for sql, want := range map[string]bool{
		"insert into t values (1)":                                     true,
		"WITH x AS (UPDATE t SET a = 1 RETURNING a) SELECT 1":          true,
		"DELETE FROM t":                                                true,
		"SELECT 1 FROM t FOR UPDATE SKIP LOCKED":                       false,
		"SELECT 1 FROM t FOR NO KEY UPDATE":                            false,
		"SELECT updated_at FROM t -- insert later":                     false,
		"SELECT 1 FROM t\n-- the update counts\nWHERE a = 1":           false,
		"UPDATE t SET a = 1 WHERE id IN (SELECT id FROM t FOR UPDATE)": true,
	} {
		if got := cost.Writes(sql); got != want {
			t.Errorf("Writes(%q) = %v, want %v", sql, got, want)
		}
	}
}

func TestRedisHookCountsRoundTrips(t *testing.T) {
	url, prefix := labtest.Redis(t)
	opts, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	client := goredis.NewClient(opts)
	defer client.Close()
	m := cost.New()
	client.AddHook(m.RedisHook())
	ctx := context.Background()
	if err := client.Ping(ctx).Err(); err != nil { // the connection's own setup is not the commands'
		t.Fatal(err)
	}
	before := read(t, m)
	if err := client.Set(ctx, prefix+"a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := client.TxPipelined(ctx, func(p goredis.Pipeliner) error { // one round trip for three commands
		p.Get(ctx, prefix+"a")
		p.Incr(ctx, prefix+"b")
		p.Del(ctx, prefix+"b")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, m).Per(before, 1).RedisTrips; got != 2 {
		t.Errorf("round trips = %v, want 2", got)
	}
}

func TestHTTPCountsByRoute(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	m := cost.New()
	hc := &http.Client{Transport: m.Transport(http.DefaultTransport)}
	for _, path := range []string{"/provider/captures", "/provider/captures", "/provider/namespaces/acme"} {
		resp, err := hc.Post(srv.URL+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if resp, err := hc.Get(srv.URL + "/provider/captures?run=r1"); err == nil {
		resp.Body.Close()
	}
	m.Received("POST /webhooks/provider")
	c := read(t, m)
	if c.HTTPOut["POST /captures"] != 2 || c.HTTPOut["POST /namespaces"] != 1 || c.HTTPOut["GET /captures"] != 1 || c.HTTPIn["POST /webhooks/provider"] != 1 {
		t.Errorf("out = %v, in = %v; want POST /captures 2, POST /namespaces 1, GET /captures 1, one webhook in", c.HTTPOut, c.HTTPIn)
	}
	before := c
	m.Received("POST /webhooks/provider")
	m.Received("POST /webhooks/provider")
	if per := read(t, m).Per(before, 2); per.HTTPIn["POST /webhooks/provider"] != 1 || len(per.HTTPOut) != 0 {
		t.Errorf("per op = %+v, want 1 webhook in, nothing out", per)
	}
}
