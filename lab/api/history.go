package api

import (
	"bytes"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
)

// findRun is one of the caller's recent runs on this replica, by its id.
func (s *Server) findRun(c echo.Context) (experiment.Report, error) {
	who, err := s.who(c.Request(), true)
	if err != nil {
		return experiment.Report{}, err
	}
	if r, ok := s.deps.Service.FindRun(who.view(), c.Param("id")); ok {
		return r, nil
	}
	return experiment.Report{}, runNotFound(c.Param("id"), who.view())
}

// runNotFound is the answer for a run the caller has none of here.
func runNotFound(id string, view lab.Namespace) error {
	return problem(http.StatusNotFound, "run_not_found", "Run not found",
		"no run "+strconv.Quote(id)+" among the recent runs of namespace "+nsName(view)+" on this replica")
}

// runHistory answers a run's history as NDJSON: a line naming the run, one
// line per operation, one per fault event (docs/history.md). lab
// check-history reads it back.
func (s *Server) runHistory(c echo.Context) error {
	r, err := s.findRun(c)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := r.History.WriteNDJSON(&b); err != nil {
		return err
	}
	return c.Blob(http.StatusOK, "application/x-ndjson", b.Bytes())
}

// runHistoryPage draws a run's history as porcupine's visualization, with
// the fault events and the ledger reads: one self-contained page.
func (s *Server) runHistoryPage(c echo.Context) error {
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	page, found, err := s.deps.Service.Picture(who.view(), c.Param("id"))
	switch {
	case err != nil:
		return err
	case !found:
		return runNotFound(c.Param("id"), who.view())
	}
	// The picture's script and style are inline; it may load nothing else.
	c.Response().Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
	return c.HTMLBlob(http.StatusOK, page)
}
