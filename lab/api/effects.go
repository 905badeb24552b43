package api

import (
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab/api/wire"
)

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
	m, err := s.deps.Service.Effects(c.Request().Context(), who.Identity, nil)
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
