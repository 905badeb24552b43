package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labsvc"
)

// problemError is an error that already knows its problem.
type problemError struct {
	status int
	code   string
	title  string
	detail string
	param  string
}

func (p *problemError) Error() string { return p.code + ": " + p.detail }

// problem is the RFC 9457 body p is answered with.
func (p *problemError) problem() lab.Problem {
	return lab.Problem{Title: p.title, Status: p.status, Code: p.code, Detail: p.detail, Param: p.param}
}

func problem(status int, code, title, detail string) *problemError {
	return &problemError{status: status, code: code, title: title, detail: detail}
}

var (
	errUnauthorized = problem(http.StatusUnauthorized, "unauthorized", "Unauthorized",
		"send Authorization: Bearer <token> with a known tenant token")
	errKeyMissing = problem(http.StatusBadRequest, "idempotency_key_missing", "Idempotency-Key missing",
		"this store needs an Idempotency-Key header (1..255 bytes of printable text)")
	errAdmin = problem(http.StatusUnauthorized, "admin_token_required", "Admin token required",
		"send the admin token as Authorization: Bearer <token>")
)

// problemJSON is the media type of every error body (RFC 9457).
const problemJSON = "application/problem+json"

// toProblem is the one table that turns errors into HTTP problems;
// requestEnded says whether the request's own context is done, which tells
// its cancellation from a dependency's timeout.
func toProblem(err error, requestEnded bool) (*problemError, time.Duration) {
	var (
		pe *problemError
		ie *lab.InvalidError
		ip *lab.InProgressError
		he *echo.HTTPError
		tm *labsvc.SlowLimitError
		rl *labsvc.RunLimitError
	)
	switch {
	case errors.As(err, &pe):
		return pe, 0
	case errors.As(err, &ie):
		p := problem(http.StatusBadRequest, "invalid_parameter", "Invalid parameter", ie.Error())
		p.param = ie.Param
		return p, 0
	case errors.As(err, &tm):
		return problem(http.StatusTooManyRequests, "too_many_requests", "Too many requests", tm.Error()), time.Second
	case errors.As(err, &rl) && rl.Namespace:
		return problem(http.StatusTooManyRequests, "too_many_runs", "Too many runs", rl.Error()), time.Second
	case errors.As(err, &rl):
		return problem(http.StatusServiceUnavailable, "lab_busy", "Lab busy", rl.Error()), time.Second
	case errors.Is(err, labsvc.ErrCheckRunning):
		return problem(http.StatusConflict, "check_running", "Check running", err.Error()), time.Second
	case errors.Is(err, labsvc.ErrEffectsRunning):
		return problem(http.StatusConflict, "effects_running", "Effects matrix running", err.Error()), 0
	case errors.As(err, &ip):
		return problem(http.StatusConflict, "idempotency_in_progress", "Request in progress",
			"a request with this Idempotency-Key is still being processed; retry after the Retry-After delay"), ip.RetryAfter
	case errors.Is(err, lab.ErrKeyReused):
		return problem(http.StatusUnprocessableEntity, "idempotency_key_reused", "Idempotency-Key reused",
			"this Idempotency-Key was first used with a different request; use a new key for a new charge"), 0
	case errors.Is(err, lab.ErrFailoverUnderWay):
		return problem(http.StatusConflict, "failover_under_way", "Failover under way", err.Error()), time.Second
	case errors.Is(err, lab.ErrOutboxWrite):
		return problem(http.StatusServiceUnavailable, "charge_failed", "Charge failed",
			"writing the receipt event failed, so nothing was charged or stored; retrying with the same key is safe"), time.Second
	case errors.Is(err, lab.ErrOutcomeUnknown):
		return problem(http.StatusServiceUnavailable, "outcome_unknown", "Outcome unknown",
			"the charge may or may not have been applied and the ledger cannot be reached; retry with the same key once it answers"), time.Second
	case errors.Is(err, lab.ErrStoreUnavailable):
		return problem(http.StatusServiceUnavailable, "store_unavailable", "Store unavailable", err.Error()), time.Second
	case requestEnded && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return problem(http.StatusServiceUnavailable, "request_cancelled", "Request cancelled",
			"the request ended before the charge completed; nothing was stored, retrying with the same key is safe"), time.Second
	case errors.As(err, &he):
		code := "http_" + strconv.Itoa(he.Code)
		if he.Code == http.StatusNotFound {
			code = "not_found"
		}
		return problem(he.Code, code, http.StatusText(he.Code), http.StatusText(he.Code)), 0
	}
	// Whatever is left failed below the API: a dependency (PostgreSQL,
	// Redis, the provider) that dropped, refused or did not answer in time.
	// Never a bare 500: the client is told to come back, and a retry with
	// the same key is safe.
	return problem(http.StatusServiceUnavailable, "unavailable", "Service unavailable",
		"a service the lab depends on failed before the answer was known; retry with the same key to learn the outcome"), time.Second
}

// injected reports whether err is what the request's Lab-Fault asked
// for: the outbox write outbox_fail fails, or the call whose answer
// applied_response_lost has the provider withhold until it times out.
func injected(r *http.Request, err error) bool {
	f, _ := lab.ParseFaults(r.Header.Get(lab.FaultHeader))
	var timeout interface{ Timeout() bool }
	return errors.Is(err, lab.ErrOutboxWrite) || f.Has(lab.FaultAppliedResponseLost) && errors.As(err, &timeout) && timeout.Timeout()
}

// writeProblem sends err as application/problem+json.
func writeProblem(c echo.Context, log *slog.Logger, err error) error {
	p, retryAfter := toProblem(err, c.Request().Context().Err() != nil)
	// Injected failures are the lesson, and a client that went away its own
	// business: neither is an incident.
	if p.status >= 500 && !injected(c.Request(), err) && !errors.Is(err, context.Canceled) {
		log.ErrorContext(c.Request().Context(), "request failed", "path", c.Path(), "code", p.code, "err", err)
	}
	if retryAfter > 0 {
		c.Response().Header().Set("Retry-After", strconv.Itoa(int(max(1, retryAfter.Round(time.Second).Seconds()))))
	}
	resp := p.problem().Response()
	return c.Blob(resp.Status, problemJSON, resp.Body)
}
