package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants"
	"github.com/idempotency-lab/lab/variants/lease"
	"github.com/idempotency-lab/lab/variants/phases"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
	"github.com/idempotency-lab/lab/variants/unsafestore"
)

// Body2500 is the charge most tests send: 2,500 cents on acct-1.
const Body2500 = `{"account":"acct-1","amount_cents":2500,"currency":"USD"}`

// Config is the lab as the command builds it — the defaults and every
// built-in variant — on a free loopback port and with no embedded
// services, changed by opts.
func Config(opts ...func(*app.Config)) app.Config {
	cfg := app.DefaultConfig()
	cfg.Variants = variants.Builtin()
	cfg.Addr = "127.0.0.1:0"
	cfg.EmbedPostgres, cfg.EmbedRedis = false, false
	cfg.RedisPair = false // two redis-server processes per lab: only the tests that fail over start them
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// StoreConfig is a lab configuration in which store is available.
func StoreConfig(t testing.TB, store lab.StoreName) app.Config {
	t.Helper()
	switch store {
	case postgres.Name, lease.Name, phases.Name:
		url, schema := labtest.Postgres(t)
		return Config(func(c *app.Config) { c.DatabaseURL, c.PGSchema = url, schema })
	case redis.Name:
		url, prefix := labtest.Redis(t)
		return Config(func(c *app.Config) { c.RedisURL, c.RedisPrefix = url, prefix })
	}
	return Config()
}

// FullConfig configures every store, with the ledger in PostgreSQL.
func FullConfig(t testing.TB) app.Config {
	t.Helper()
	url, schema := labtest.Postgres(t)
	redisURL, prefix := labtest.Redis(t)
	return Config(func(c *app.Config) {
		c.DatabaseURL, c.PGSchema, c.RedisURL, c.RedisPrefix = url, schema, redisURL, prefix
	})
}

// EffectsConfig is a lab with its ledger in PostgreSQL and a relay quick
// enough to retry a flaky provider within a test.
func EffectsConfig(t testing.TB, opts ...func(*app.Config)) app.Config {
	t.Helper()
	url, schema := labtest.Postgres(t)
	return Config(append([]func(*app.Config){func(c *app.Config) {
		c.DatabaseURL, c.PGSchema = url, schema
		c.Relay.Interval, c.Relay.Workers, c.Relay.MaxAttempts = 5*time.Millisecond, 4, 60
		c.Relay.BaseBackoff, c.Relay.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
		// Short, so a withheld answer times out soon; not shorter: a loaded
		// machine runs several such labs at once, and a capture that outlives
		// the timeout is redelivered, which a random key captures twice (at
		// 1 s, two suites side by side broke provider_down that way).
		c.ProviderTimeout = 3 * time.Second
	}}, opts...)...)
}

// OpenRun opens a run of the public namespace (acme's), as the lab's own
// runs do before their charges carry it in Lab-Run.
func OpenRun(t testing.TB, a *app.App, run string) {
	t.Helper()
	if err := a.Books().OpenRun(context.Background(), "acme", run); err != nil {
		t.Fatal(err)
	}
}

// RunStats is what the ledger and the outbox hold of a run of acme's.
func RunStats(t testing.TB, a *app.App, run string) lab.RunStats {
	t.Helper()
	s, err := a.Books().RunStats(context.Background(), "acme", run)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// KeyCharges counts the ledger's charges under one key of a tenant's.
func KeyCharges(t testing.TB, a *app.App, tenant string, store lab.StoreName, key string) int {
	t.Helper()
	k, err := a.Books().KeyCharges(context.Background(), tenant, store, key)
	if err != nil {
		t.Fatal(err)
	}
	return k.Charges
}

// Run fires a lab run (its route's query) and returns its report.
func Run(t testing.TB, base string, store lab.StoreName, query string) experiment.Report {
	t.Helper()
	route := "/charge-idempotent?store=" + string(store) + "&"
	if store == unsafestore.Name {
		route = "/charge-unsafe?"
	}
	r := labtest.Do(t, http.MethodGet, base+route+query, nil, "")
	if r.Status != http.StatusOK {
		t.Fatalf("run %s: %d %s", query, r.Status, r.Body)
	}
	var rep experiment.Report
	if err := json.Unmarshal(r.Body, &rep); err != nil {
		t.Fatalf("decoding the report of %s: %v", query, err)
	}
	return rep
}

// RunOvertaken runs a stale worker on a fresh key (query adds to it) until
// a retry took the paused worker's key over, three runs at most: on a busy
// machine the retries can reach the server after the worker woke, and such
// a run is inconclusive.
func RunOvertaken(t testing.TB, base string, store lab.StoreName, query string) experiment.Report {
	t.Helper()
	query = "fault=stale_worker&key=fresh&" + query
	rep := Run(t, base, store, query)
	for try := 1; try < 3 && rep.Verdict == lab.Inconclusive && strings.HasPrefix(rep.Reason, experiment.NotOvertaken); try++ {
		t.Logf("%s: %s; running it again", rep.RunID, rep.Reason)
		rep = Run(t, base, store, query)
	}
	return rep
}

// PostWithFault sends a charge as acme carrying a Lab-Fault header, on a
// connection of its own: a dropped connection is the error.
func PostWithFault(base string, store lab.StoreName, key, fault string) (labtest.Reply, error) {
	return labtest.SendCharge(base, store, labtest.Acme, key, Body2500, http.Header{lab.FaultHeader: {fault}})
}

// Pool is the test's own connection to the lab's PostgreSQL, for what
// only the database can tell (locks, sessions).
func Pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// KeyState is the key's state in store, as token sees it.
func KeyState(t testing.TB, base, token string, store lab.StoreName, key string) string {
	t.Helper()
	return labtest.Get[struct {
		KeyState string `json:"key_state"`
	}](t, base+"/idempotency/state?store="+string(store)+"&key="+key, token).KeyState
}

// WaitKeyState waits until the key's state is want.
func WaitKeyState(t testing.TB, base, token string, store lab.StoreName, key, want string) {
	t.Helper()
	labtest.Eventually(t, key+" becoming "+want, func() bool { return KeyState(t, base, token, store, key) == want })
}

// CheckExplanation holds a run's explanation to the figures of its own report.
func CheckExplanation(t *testing.T, name string, rep experiment.Report) {
	t.Helper()
	text := rep.Explanation
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s: %s\n  explanation: %s\n  figures: verdict %s, added %d, key charges %d, replays %d, 409 %d, 422 %d, key before %q",
			name, fmt.Sprintf(format, args...), text, rep.Verdict, rep.ChargesApplied, rep.KeyCharges, rep.IdempotencyHits,
			rep.InProgress, rep.Rejections, rep.KeyBefore)
	}
	if text == "" && rep.Verdict != lab.Inconclusive {
		fail("no explanation")
	}
	number := func(pattern string) (int, bool) {
		m := regexp.MustCompile(pattern).FindStringSubmatch(text)
		if m == nil {
			return 0, false
		}
		n, _ := strconv.Atoi(m[1])
		return n, true
	}
	earlier := rep.KeyCharges - rep.ChargesApplied
	if n, ok := number(`charged before this run \((\d+) charge`); ok && n != earlier {
		fail("says %d earlier charges, the ledger had %d", n, earlier)
	} else if !ok && earlier > 0 && rep.Verdict != lab.Inconclusive {
		fail("does not say the key had %d charge(s) before the run", earlier)
	}
	if strings.Contains(text, "added nothing") != (earlier > 0 && rep.ChargesApplied == 0 && rep.Verdict != lab.Inconclusive) {
		fail("'added nothing' against %d added", rep.ChargesApplied)
	}
	if n, ok := number(`charged (\d+) more`); ok && n != rep.ChargesApplied {
		fail("says %d more, the run added %d", n, rep.ChargesApplied)
	}
	for pattern, want := range map[string]int{`(\d+) replayed`: rep.IdempotencyHits, `(\d+) got 409`: rep.InProgress, `(\d+) got 422`: rep.Rejections} {
		if n, ok := number(pattern); ok && n != want {
			fail("%q says %d, the report %d", pattern, n, want)
		}
	}
	if strings.HasPrefix(text, "Unexpectedly") && (earlier > 0 || rep.Verdict == rep.ExpectedVerdict) {
		fail("'Unexpectedly' on a %s verdict (usually %s, %d earlier charges)", rep.Verdict, rep.ExpectedVerdict, earlier)
	}
	// A break is a duplicate in the ledger, or (a PostgreSQL failover) a
	// charge a client was told of that the surviving books lost.
	if (rep.Verdict == lab.Breaks) != (rep.DuplicatesApplied > 0 || len(rep.LostAcknowledged) > 0) {
		fail("verdict %s with %d duplicates applied and %v acknowledged charges lost", rep.Verdict, rep.DuplicatesApplied, rep.LostAcknowledged)
	}
}
