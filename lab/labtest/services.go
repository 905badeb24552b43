package labtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-lab/lab/lab/pgdb/throwaway"
	"github.com/idempotency-lab/lab/lab/redisdb"
)

// The services' variables, with what each looks like.
const (
	databaseURL     = "DATABASE_URL"
	databaseExample = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	redisURL        = "REDIS_URL"
	redisExample    = "redis://127.0.0.1:6379/0"
)

// startTimeout bounds starting the services, initdb included.
const startTimeout = 2 * time.Minute

// M runs a test binary's tests: a *testing.M, or what WithServices makes
// of one (goleak.VerifyTestMain takes either).
type M interface{ Run() int }

// WithServices wraps m so that its Run gives the tests PostgreSQL and Redis
// when DATABASE_URL or REDIS_URL is unset: for the whole test binary, one
// throwaway PostgreSQL cluster where its server binaries are installed, and
// one redis-server (else an embedded miniredis), on free loopback ports.
// Their URLs are set in the environment, so tests find them as they find
// the machine's (ServiceURL, Postgres, Redis); they are stopped, and their
// files removed, before Run returns. With the URLs set, as in CI, it starts
// nothing. A service it cannot start leaves ServiceURL the reason, naming
// what to install. A package whose tests need the services runs them so:
//
//	func TestMain(m *testing.M) { os.Exit(labtest.WithServices(m).Run()) }
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(labtest.WithServices(m)) }
//
// With -v it says in one line which services the binary uses.
func WithServices(m M) M {
	return services{m: m, findPostgres: throwaway.Find, findRedis: redisdb.FindServer}
}

// services runs m with the services; the finders say whether the servers'
// binaries are installed.
type services struct {
	m                       M
	findPostgres, findRedis func() (string, error)
}

// service is one of the binary's services: what it is, for the log line,
// and how to stop it when WithServices started it.
type service struct {
	what string
	stop func() error
}

func (s services) Run() (code int) {
	if !flag.Parsed() {
		flag.Parse() // for testing.Verbose and -test.parallel; m.Run parses once
	}
	waitBoundParallel()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	pg := s.startPostgres(ctx)
	rd := s.startRedis(ctx)
	cancel()
	// Deferred, so a panic out of the tests stops them too.
	defer func() {
		// The idle keep-alive connections of the tests' own client (Do's)
		// are not the code's: a goroutine check after Run must not see them.
		http.DefaultClient.CloseIdleConnections()
		if err := errors.Join(rd.stop(), pg.stop()); err != nil {
			fmt.Fprintln(os.Stderr, "labtest: stopping the services:", err)
			code = max(code, 1)
		}
	}()
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "labtest: PostgreSQL: %s; Redis: %s\n", pg.what, rd.what)
	}
	return s.m.Run()
}

// waitBoundParallel lets four parallel tests run at once, not one per
// core, unless -parallel says otherwise: tests with the services spend
// their time waiting on servers, processes and timers, not computing.
func waitBoundParallel() {
	const n = 4
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && runtime.GOMAXPROCS(0) < n {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}

// startPostgres gives the tests DATABASE_URL: the one set, or a throwaway
// cluster's.
func (s services) startPostgres(ctx context.Context) service {
	if u := os.Getenv(databaseURL); u != "" {
		return given(databaseURL, u)
	}
	if _, err := s.findPostgres(); err != nil {
		why := err.Error() + " (or set " + databaseURL + "=" + databaseExample + ")"
		if runtime.GOOS == "linux" {
			why = "PostgreSQL's server binaries (initdb, postgres) are not installed: apt-get install postgresql, or set " +
				databaseURL + "=" + databaseExample
		}
		return missing(databaseURL, why)
	}
	c, err := throwaway.Start(ctx, slog.New(slog.DiscardHandler), "max_connections="+strconv.Itoa(maxConnections()))
	if err != nil {
		return missing(databaseURL, "the throwaway PostgreSQL cluster did not start ("+err.Error()+"): set "+
			databaseURL+"="+databaseExample)
	}
	return provided(databaseURL, c.URL(), "a throwaway cluster at "+c.URL()+", removed at exit", c.Close)
}

// maxConnections is enough for the binary's parallel tests, each of which
// may run a lab or two with pools of 20 connections.
func maxConnections() int {
	parallel := runtime.GOMAXPROCS(0)
	if f := flag.Lookup("test.parallel"); f != nil {
		if n, err := strconv.Atoi(f.Value.String()); err == nil {
			parallel = n
		}
	}
	return max(300, 50*parallel)
}

// startRedis gives the tests REDIS_URL: the one set, a throwaway
// redis-server's, or else an embedded miniredis's.
func (s services) startRedis(ctx context.Context) service {
	if u := os.Getenv(redisURL); u != "" {
		return given(redisURL, u)
	}
	why := "redis-server is not installed: apt-get install redis-server for a real one"
	if _, err := s.findRedis(); err == nil {
		r, err := redisdb.StartThrowaway(ctx)
		if err == nil {
			return provided(redisURL, r.URL(), "redis-server at "+r.URL()+", stopped at exit",
				func() error { r.Close(); return nil })
		}
		why = "redis-server did not start (" + err.Error() + ")"
	}
	e, err := redisdb.StartEmbedded()
	if err != nil {
		return missing(redisURL, "the embedded Redis (miniredis) did not start ("+err.Error()+"), and "+why+
			"; or set "+redisURL+"="+redisExample)
	}
	return provided(redisURL, e.URL(), "an embedded miniredis at "+e.URL()+" ("+why+")",
		func() error { e.Close(); return nil })
}

// given is a service the environment names.
func given(env, u string) service {
	host := "unparsable"
	if p, err := url.Parse(u); err == nil {
		host = p.Host // never the password
	}
	return service{what: env + " (" + host + ")", stop: func() error { return nil }}
}

// provided is a service WithServices started, its URL set for the tests.
func provided(env, u, what string, stop func() error) service {
	_ = os.Setenv(env, u)
	return service{what: what, stop: func() error {
		_ = os.Unsetenv(env)
		return stop()
	}}
}

// missing is a service there is none of; ServiceURL tells tests why.
func missing(env, why string) service {
	_ = os.Setenv(whyEnv(env), why)
	return service{what: "none: " + why, stop: func() error {
		_ = os.Unsetenv(whyEnv(env))
		return nil
	}}
}

// whyEnv carries, from WithServices to ServiceURL, why the binary has no
// value of env: the environment is the one place both see.
func whyEnv(env string) string {
	return "LAB_TEST_WHY_NO_" + strings.ToUpper(env)
}
