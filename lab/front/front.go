// Package front is the small round-robin proxy in front of a lab cluster:
// curl users hit one port, and replicas that fail their health check are
// taken out of the rotation until they answer again.
package front

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// StatusPath reports the front's view of its replicas; it is not proxied.
const StatusPath = "/front/status"

// Front proxies to healthy replicas in turn.
type Front struct {
	targets  []*middleware.ProxyTarget
	balancer middleware.ProxyBalancer
	client   *http.Client
	runs     *http.Client // asks the replicas for a run
	interval time.Duration
	log      *slog.Logger
	echo     *echo.Echo

	mu      sync.Mutex
	healthy map[string]bool
}

// runPath is a run's own route (GET /lab/runs/{run_id}, its history and
// its picture), under any base path.
var runPath = regexp.MustCompile(`/lab/runs/run_[^/]+(/history|/history\.html)?$`)

// runOnAnyReplica finds a run wherever it was run: a replica keeps its
// own runs, so a run's routes go to each healthy replica in turn until
// one knows it; when none does, the last one's 404 is the answer.
func (f *Front) runOnAnyReplica(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if r.Method != http.MethodGet || !runPath.MatchString(r.URL.Path) {
			return next(c)
		}
		var last *http.Response
		for _, t := range f.targets {
			f.mu.Lock()
			ok := f.healthy[t.Name]
			f.mu.Unlock()
			if !ok {
				continue
			}
			req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, t.URL.String()+r.URL.RequestURI(), nil)
			if err != nil {
				return fmt.Errorf("error building the request to %s: %w", t.Name, err)
			}
			for _, h := range []string{"Authorization", "Accept"} {
				if v := r.Header.Get(h); v != "" {
					req.Header.Set(h, v)
				}
			}
			resp, err := f.runs.Do(req)
			if err != nil {
				if r.Context().Err() != nil {
					return r.Context().Err() // the client left: nobody to answer
				}
				f.log.Warn("asking a replica for a run", "replica", t.Name, "err", err)
				continue
			}
			if last != nil {
				last.Body.Close()
			}
			last = resp
			if resp.StatusCode != http.StatusNotFound && resp.StatusCode < 500 {
				break // this replica has it (or says why not): ask no other
			}
		}
		if last == nil {
			return next(c) // no replica answered: the proxy says why
		}
		defer last.Body.Close()
		for _, h := range []string{"Content-Type", "Content-Security-Policy", "Lab-Replica"} {
			if v := last.Header.Get(h); v != "" {
				c.Response().Header().Set(h, v)
			}
		}
		c.Response().WriteHeader(last.StatusCode)
		_, err := io.Copy(c.Response(), last.Body)
		return err
	}
}

// New builds a front for the replicas' base URLs. Replicas start out of the
// rotation until their first health check passes.
func New(targets []string, interval time.Duration, log *slog.Logger) (*Front, error) {
	switch {
	case len(targets) == 0:
		return nil, errors.New("the front needs at least one replica URL")
	case interval <= 0:
		return nil, fmt.Errorf("the health check interval must be positive (got %s)", interval)
	case log == nil:
		return nil, errors.New("the front needs a logger")
	}
	f := &Front{
		balancer: middleware.NewRoundRobinBalancer(nil), interval: interval, log: log,
		client: &http.Client{Timeout: 2 * time.Second}, runs: &http.Client{Timeout: 30 * time.Second}, healthy: map[string]bool{},
	}
	for _, raw := range targets {
		u, err := url.Parse(raw)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return nil, fmt.Errorf("invalid replica URL %q: want http://host:port", raw)
		}
		f.targets = append(f.targets, &middleware.ProxyTarget{Name: raw, URL: u})
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.GET(StatusPath, f.status)
	e.Use(f.runOnAnyReplica)
	e.Use(middleware.ProxyWithConfig(middleware.ProxyConfig{
		Balancer: f.balancer,
		Skipper:  func(c echo.Context) bool { return c.Request().URL.Path == StatusPath },
		// No retries: re-sending a charge is the client's decision, never the proxy's.
		RetryCount: 0,
	}))
	f.echo = e
	return f, nil
}

// Handler serves the front.
func (f *Front) Handler() http.Handler { return f.echo }

// CheckOnce health-checks every replica and updates the rotation.
func (f *Front) CheckOnce(ctx context.Context) {
	for _, t := range f.targets {
		ok := f.ping(ctx, t.URL.String()+"/health")
		f.mu.Lock()
		was := f.healthy[t.Name]
		f.healthy[t.Name] = ok
		f.mu.Unlock()
		switch {
		case ok && !was:
			f.balancer.AddTarget(t)
			f.log.Info("replica in rotation", "replica", t.Name)
		case !ok && was:
			f.balancer.RemoveTarget(t.Name)
			f.log.Warn("replica out of rotation: health check failed", "replica", t.Name)
		}
	}
}

func (f *Front) ping(ctx context.Context, u string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Run health-checks the replicas until ctx ends.
func (f *Front) Run(ctx context.Context) {
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		f.CheckOnce(ctx)
		select {
		case <-ctx.Done():
			f.client.CloseIdleConnections()
			f.runs.CloseIdleConnections()
			return
		case <-t.C:
		}
	}
}

func (f *Front) status(c echo.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]bool{}
	for _, t := range f.targets {
		out[t.Name] = f.healthy[t.Name]
	}
	return c.JSON(http.StatusOK, map[string]any{"replicas": out})
}
