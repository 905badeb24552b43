package api

import (
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab/api/wire"
	"github.com/idempotency-lab/lab/lab/provider"
	"github.com/idempotency-lab/lab/lab/reconcile"
)

// reconcileLimit bounds how many charges and captures one check compares.
const reconcileLimit = 1000

// reconcileCheck is GET /lab/reconcile: the caller's charges compared with
// what the provider recorded, one finding per charge that disagrees.
func (s *Server) reconcileCheck(c echo.Context) error {
	ctx := c.Request().Context()
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	run, err := q.Text("run", "", 128)
	if err != nil {
		return err
	}
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	ns := who.view()
	payments, err := s.deps.Books.Payments(ctx, ns, run, reconcileLimit)
	if err != nil {
		return err
	}
	captures, err := s.deps.Provider.Captures(ctx, provider.Filter{Namespace: string(ns), Run: run, Limit: reconcileLimit})
	if err != nil {
		return fmt.Errorf("error reading the provider's captures: %w", err)
	}
	rep := reconcile.CompareWithin(payments, captures, len(payments) == reconcileLimit, len(captures) == reconcileLimit,
		reconcile.Bounds{Now: s.cfg.Clock(), StuckAfter: s.cfg.StuckAfter})
	rep.Namespace, rep.Run = string(ns), run
	return c.JSON(http.StatusOK, rep)
}
