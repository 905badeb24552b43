package api

import (
	"context"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/tenants"
	"github.com/idempotency-lab/lab/lab/variant"
)

var errEffectsRunning = problem(http.StatusConflict, "effects_running", "Effects matrix running",
	"this namespace is already running the effects matrix: the provider's faults are the namespace's while it runs; wait for it to end")

// effectStores picks the store of each transport: the first available
// variant sending directly, and the first keyed one writing an outbox whose
// concurrent retries hold: the matrix judges the effects of one charge, so
// the charge itself must be decided once.
func (s *Server) effectStores() (map[string]lab.StoreName, error) {
	out := map[string]lab.StoreName{}
	for _, v := range s.deps.Variants.All() {
		if _, ok := s.deps.Stores[v.Name]; !ok {
			continue
		}
		keyed := v.RequiresKey && v.Mechanisms[variant.CaseRetries].Usual == lab.Holds
		if _, have := out[v.Effects]; !have && (v.Effects == "direct" || keyed) {
			out[v.Effects] = v.Name
		}
	}
	if out["direct"] == "" || out["outbox"] == "" {
		return nil, lab.Invalid("store", "the effects matrix needs a variant that sends directly and a keyed one with an outbox whose retries hold")
	}
	return out, nil
}

// Effects runs the effects matrix in id's namespace, one at a time per
// namespace on this replica.
func (s *Server) Effects(ctx context.Context, id tenants.Identity, progress func(done, total int, c experiment.EffectCase, d experiment.EffectDesign)) (experiment.EffectMatrix, error) {
	stores, err := s.effectStores()
	if err != nil {
		return experiment.EffectMatrix{}, err
	}
	s.mu.Lock()
	if s.effects[id.Namespace] {
		s.mu.Unlock()
		return experiment.EffectMatrix{}, errEffectsRunning
	}
	s.effects[id.Namespace] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.effects, id.Namespace)
		s.mu.Unlock()
	}()
	targets, err := s.deps.Cluster.Targets(ctx, 1)
	if err != nil {
		return experiment.EffectMatrix{}, err
	}
	return s.deps.Runner.RunEffects(ctx, experiment.EffectsRequest{
		Target: targets[0], Tenant: id.Tenant, Token: id.Token, Namespace: id.Namespace, Stores: stores,
		Account: defaultAccount, Amount: defaultAmount, Progress: progress,
	})
}

// effectsMatrix is GET /lab/effects: each way of sending a charge's effects
// against each way the provider misbehaves, judged from the ledger and the
// provider's own records.
func (s *Server) effectsMatrix(c echo.Context) error {
	if err := s.requireFaults(); err != nil {
		return err
	}
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	format, err := q.Choice("format", "json", "json", "markdown", "table")
	if err != nil {
		return err
	}
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	m, err := s.Effects(c.Request().Context(), who.Identity, nil)
	if err != nil {
		return err
	}
	return writeMatrix(c, format, m)
}

// tableWriter is a matrix in its text forms.
type tableWriter interface {
	WriteMarkdown(w io.Writer) error
	WriteTable(w io.Writer) error
}

// writeMatrix answers a matrix in the format asked: json, markdown or table.
func writeMatrix(c echo.Context, format string, m tableWriter) error {
	switch format {
	case "markdown":
		c.Response().Header().Set(echo.HeaderContentType, "text/markdown; charset=utf-8")
		c.Response().WriteHeader(http.StatusOK)
		return m.WriteMarkdown(c.Response())
	case "table":
		c.Response().Header().Set(echo.HeaderContentType, echo.MIMETextPlainCharsetUTF8)
		c.Response().WriteHeader(http.StatusOK)
		return m.WriteTable(c.Response())
	}
	return c.JSON(http.StatusOK, m)
}
