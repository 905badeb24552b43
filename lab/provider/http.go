package provider

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
)

// Headers of the capture route.
const (
	KeyHeader      = "Idempotency-Key"
	ReplayedHeader = "Idempotent-Replayed"
)

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 16 << 10

// maxText bounds the text fields of a body and the key.
const maxText = 255

// recordTimeout bounds one write to the records. The write runs to its
// end even if the client hangs up: a provider does not undo a capture
// because nobody waits for the answer.
const recordTimeout = 10 * time.Second

// ReceiptResponse is the body of a receipt's answer.
type ReceiptResponse struct {
	EventID   string `json:"event_id"`
	Duplicate bool   `json:"duplicate"`
}

// StatsReport is the body of GET /stats: the records' figures for the
// filter, and the process's counters whatever the filter.
type StatsReport struct {
	Stats
	Counters
}

// problem is an error that knows its HTTP answer.
type problem struct {
	status int
	code   string
	title  string
	detail string
}

func (p *problem) Error() string { return p.code + ": " + p.detail }

func badRequest(code, title, detail string) *problem {
	return &problem{http.StatusBadRequest, code, title, detail}
}

var (
	errKeyMissing = badRequest("idempotency_key_missing", "Idempotency-Key missing",
		"a capture needs an Idempotency-Key header (1..255 printable ASCII characters)")
	errInProgress = &problem{http.StatusConflict, "capture_in_progress", "Capture in progress",
		"another request with this Idempotency-Key is being handled; retry when it has been answered"}
	errUnauthenticated = &problem{http.StatusUnauthorized, "unauthenticated", "Unauthenticated",
		"the provider's API asks for its API key: send Authorization: Bearer <key>; nothing was read or changed"}
	errInjected = &problem{http.StatusServiceUnavailable, "provider_unavailable", "Provider unavailable",
		"the provider failed (an injected error); nothing was recorded, so a retry is safe"}
)

// toProblem is the one table that turns errors into HTTP answers.
func toProblem(err error) *problem {
	var p *problem
	switch {
	case errors.As(err, &p):
		return p
	case errors.Is(err, ErrKeyMismatch):
		return &problem{http.StatusUnprocessableEntity, "idempotency_key_reused", "Idempotency-Key reused",
			"this Idempotency-Key was first used with another request (charge, tenant, amount or currency); use a new key for a new capture"}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &problem{http.StatusServiceUnavailable, "request_cancelled", "Request cancelled",
			"the request ended before it was handled; nothing was recorded"}
	}
	return &problem{http.StatusServiceUnavailable, "records_unavailable", "Records unavailable",
		"the provider could not reach its records, so the outcome is unknown; retry with the same key to learn it"}
}

// fail answers err as application/problem+json.
func (p *Provider) fail(c echo.Context, err error) error {
	pr := toProblem(err)
	if pr.code == "records_unavailable" {
		p.cfg.Logger.ErrorContext(c.Request().Context(), "provider request failed", "path", c.Path(), "err", err)
	}
	if pr.status == http.StatusConflict || pr.status == http.StatusServiceUnavailable {
		c.Response().Header().Set("Retry-After", "1")
	}
	resp := lab.Problem{Title: pr.title, Status: pr.status, Code: pr.code, Detail: pr.detail}.Response()
	return c.Blob(resp.Status, "application/problem+json", resp.Body)
}

// authenticate lets through the requests that carry the API key, compared
// in constant time; the others are answered 401 before anything is read,
// a fault included.
func (p *Provider) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		token, ok := strings.CutPrefix(c.Request().Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(token), []byte(p.cfg.APIKey)) != 1 {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="provider"`)
			return p.fail(c, errUnauthenticated)
		}
		return next(c)
	}
}

// decodeStrict reads one JSON object into v with the lab's strict reader:
// no unknown or repeated field, nothing after it, at most MaxBodyBytes.
func decodeStrict(c echo.Context, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), c.Request().Body, MaxBodyBytes))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return &problem{http.StatusRequestEntityTooLarge, "body_too_large", "Body too large",
			fmt.Sprintf("a body holds at most %d bytes", MaxBodyBytes)}
	case err != nil:
		return badRequest("invalid_body", "Invalid body", "the body could not be read")
	}
	if err := wire.Decode(body, v); err != nil {
		return badRequest("invalid_body", "Invalid body", err.Error())
	}
	return nil
}

func invalidBody(format string, args ...any) *problem {
	return badRequest("invalid_body", "Invalid body", fmt.Sprintf(format, args...))
}

var currencyCode = regexp.MustCompile(`^[A-Z]{3}$`)

// printable accepts 0..255 characters of printable ASCII (min 1 when required).
func printable(s string, required bool) bool {
	if (required && s == "") || len(s) > maxText {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func checkText(name, v string, required bool) error {
	if !printable(v, required) {
		if required {
			return invalidBody("%s must hold 1..%d printable ASCII characters", name, maxText)
		}
		return invalidBody("%s must hold at most %d printable ASCII characters", name, maxText)
	}
	return nil
}

func checkTenant(ns, tenant string) error {
	if err := checkText("tenant", tenant, true); err != nil {
		return err
	}
	if err := lab.CheckNamespace(ns); err != nil {
		return invalidBody("namespace: %v", err)
	}
	return nil
}

func checkVia(via string) error {
	if via != ViaOutbox && via != ViaDirect {
		return invalidBody("via must be %q or %q (got %q)", ViaOutbox, ViaDirect, via)
	}
	return nil
}

func (r CaptureRequest) validate() error {
	if err := checkText("charge_id", r.ChargeID, true); err != nil {
		return err
	}
	if err := checkTenant(r.Namespace, r.Tenant); err != nil {
		return err
	}
	if err := checkText("run", r.Run, false); err != nil {
		return err
	}
	if err := checkText("event_id", r.EventID, false); err != nil {
		return err
	}
	if r.AmountCents <= 0 {
		return invalidBody("amount_cents must be a positive integer (got %d)", r.AmountCents)
	}
	if !currencyCode.MatchString(r.Currency) {
		return invalidBody("currency must be three upper-case letters, e.g. USD (got %q)", r.Currency)
	}
	return checkVia(r.Via)
}

func (r ReceiptRequest) validate() error {
	if err := checkText("event_id", r.EventID, true); err != nil {
		return err
	}
	if err := checkText("charge_id", r.ChargeID, true); err != nil {
		return err
	}
	if err := checkTenant(r.Namespace, r.Tenant); err != nil {
		return err
	}
	if err := checkText("run", r.Run, false); err != nil {
		return err
	}
	return checkVia(r.Via)
}

// idempotencyKey reads the capture's key: one header line of 1..255
// printable ASCII characters.
func idempotencyKey(h http.Header) (string, error) {
	lines := h.Values(KeyHeader)
	switch {
	case len(lines) == 0 || (len(lines) == 1 && lines[0] == ""):
		return "", errKeyMissing
	case len(lines) > 1:
		return "", badRequest("idempotency_key_invalid", "Idempotency-Key invalid", "send the Idempotency-Key header once")
	case !printable(lines[0], true):
		return "", badRequest("idempotency_key_invalid", "Idempotency-Key invalid",
			fmt.Sprintf("an Idempotency-Key holds 1..%d printable ASCII characters", maxText))
	}
	return lines[0], nil
}

// requestFaults reads the Provider-Fault header, all its lines.
func requestFaults(h http.Header) (override, error) {
	o, err := parseOverride(strings.Join(h.Values(FaultHeader), ","))
	if err != nil {
		return o, badRequest("invalid_fault", "Invalid Provider-Fault", err.Error())
	}
	return o, nil
}

// drop closes the connection without an answer: the client sees a
// transport error, not a status.
func (p *Provider) drop(c echo.Context) error {
	p.counters.dropped.Add(1)
	defer p.cfg.Signals.Counted.Signal()
	conn, _, err := http.NewResponseController(c.Response()).Hijack()
	if err != nil {
		// Nothing to hijack (HTTP/2): aborting the handler resets the stream.
		panic(http.ErrAbortHandler)
	}
	conn.Close() // whatever it returns, the connection is gone
	return nil
}

// withhold holds the answer of an applied request until the client gives
// up, the hold ends or the provider stops, then drops the connection.
func (p *Provider) withhold(c echo.Context) error {
	p.counters.responsesLost.Add(1)
	p.cfg.Signals.Counted.Signal()
	t := time.NewTimer(p.cfg.ResponseLostHold)
	defer t.Stop()
	select {
	case <-c.Request().Context().Done():
	case <-t.C:
	case <-p.stopped:
	}
	return p.drop(c)
}

// delay waits out the latency fault, or until the client gives up.
func delay(ctx context.Context, ms int) error {
	if ms <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// capture is POST /captures.
func (p *Provider) capture(c echo.Context) error {
	hdr, err := requestFaults(c.Request().Header)
	if err != nil {
		return p.fail(c, err)
	}
	if hdr.faults.Down { // before anything is read: the provider is not there
		return p.drop(c)
	}
	key, err := idempotencyKey(c.Request().Header)
	if err != nil {
		return p.fail(c, err)
	}
	var req CaptureRequest
	if err := decodeStrict(c, &req); err != nil {
		return p.fail(c, err)
	}
	if err := req.validate(); err != nil {
		return p.fail(c, err)
	}
	f := hdr.over(p.standing(lab.Namespace(req.Namespace)))
	if f.Down {
		return p.drop(c)
	}
	// An overlapping request is refused, as real providers do, rather than
	// queued behind the first: the retry arrived while the original was
	// still running, and the client learns it.
	flight := "capture\x00" + req.Tenant + "\x00" + key
	overlap := p.enter(flight)
	// The request is in flight until it is recorded: a withheld answer
	// leaves first, so the client's retry replays instead of meeting 409.
	done := sync.OnceFunc(func() { p.leave(flight) })
	defer done()
	if overlap {
		return p.fail(c, errInProgress)
	}
	ctx := c.Request().Context()
	if err := delay(ctx, f.LatencyMS); err != nil {
		return p.fail(c, err)
	}
	if p.hit(f.ErrorRate) {
		p.counters.errorsInjected.Add(1)
		return p.fail(c, errInjected)
	}
	status := StatusSucceeded
	if f.Decline {
		status = StatusFailed
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	capture := Capture{
		ID: "cap_" + uuid.NewString(), Key: key, ChargeID: req.ChargeID, Namespace: req.Namespace, Tenant: req.Tenant, Run: req.Run,
		AmountCents: req.AmountCents, Currency: req.Currency, Via: req.Via, Status: status,
		Fingerprint: req.Fingerprint(), CreatedAt: normalTime(p.cfg.Clock()),
	}
	// The webhooks are written with the capture, or not at all: a
	// provider that crashes after the capture still owes them.
	var receipt *Receipt
	if req.EventID != "" {
		receipt = &Receipt{EventID: req.EventID, ChargeID: req.ChargeID, Namespace: req.Namespace, Tenant: req.Tenant, Run: req.Run, Via: req.Via,
			ReceivedAt: capture.CreatedAt}
	}
	got, err := p.cfg.Records.Capture(rctx, capture, p.webhooks(capture, f), receipt)
	if err != nil {
		return p.fail(c, err)
	}
	if !got.Replayed {
		p.wakeSender()
	}
	if p.hit(f.AppliedResponseLost) {
		done()
		return p.withhold(c)
	}
	if got.Replayed {
		c.Response().Header().Set(ReplayedHeader, "true")
		return c.JSON(http.StatusOK, got)
	}
	return c.JSON(http.StatusCreated, got)
}

// receipt is POST /receipts.
func (p *Provider) receipt(c echo.Context) error {
	hdr, err := requestFaults(c.Request().Header)
	if err != nil {
		return p.fail(c, err)
	}
	if hdr.faults.Down {
		return p.drop(c)
	}
	var req ReceiptRequest
	if err := decodeStrict(c, &req); err != nil {
		return p.fail(c, err)
	}
	if err := req.validate(); err != nil {
		return p.fail(c, err)
	}
	f := hdr.over(p.standing(lab.Namespace(req.Namespace)))
	if f.Down {
		return p.drop(c)
	}
	// Overlapping deliveries of one event are counted and handled both:
	// the records deduplicate them.
	flight := "receipt\x00" + req.EventID
	p.enter(flight)
	// The request is in flight until it is recorded: a withheld answer
	// leaves first, so the client's retry replays instead of meeting 409.
	done := sync.OnceFunc(func() { p.leave(flight) })
	defer done()
	ctx := c.Request().Context()
	if err := delay(ctx, f.LatencyMS); err != nil {
		return p.fail(c, err)
	}
	if p.hit(f.ErrorRate) {
		p.counters.errorsInjected.Add(1)
		return p.fail(c, errInjected)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	dup, err := p.cfg.Records.Receipt(rctx, Receipt{
		EventID: req.EventID, ChargeID: req.ChargeID, Namespace: req.Namespace, Tenant: req.Tenant, Run: req.Run, Via: req.Via,
		ReceivedAt: normalTime(p.cfg.Clock()),
	})
	if err != nil {
		return p.fail(c, err)
	}
	if p.hit(f.AppliedResponseLost) {
		done()
		return p.withhold(c)
	}
	status := http.StatusCreated
	if dup {
		status = http.StatusOK
	}
	return c.JSON(status, ReceiptResponse{EventID: req.EventID, Duplicate: dup})
}

func invalidParam(detail string) *problem {
	return badRequest("invalid_parameter", "Invalid parameter", detail)
}

// namespaceParam reads a namespace from the path or the query ("" allowed
// in the query: any namespace).
func namespaceParam(v string, required bool) (string, error) {
	if v == "" && !required {
		return "", nil
	}
	if err := lab.CheckNamespace(v); err != nil {
		return "", invalidParam(err.Error())
	}
	return v, nil
}

func filterOf(c echo.Context) (Filter, error) {
	ns, err := namespaceParam(c.QueryParam("namespace"), false)
	if err != nil {
		return Filter{}, err
	}
	f := Filter{Namespace: ns, Run: c.QueryParam("run"), ChargeID: c.QueryParam("charge_id")}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxLimit {
			return f, invalidParam(fmt.Sprintf("limit must be an integer in 1..%d (got %q)", MaxLimit, v))
		}
		f.Limit = n
	}
	return f, nil
}

// listCaptures is GET /captures.
func (p *Provider) listCaptures(c echo.Context) error {
	f, err := filterOf(c)
	if err != nil {
		return p.fail(c, err)
	}
	list, err := p.cfg.Records.Captures(c.Request().Context(), f)
	if err != nil {
		return p.fail(c, err)
	}
	if list == nil {
		list = []Capture{}
	}
	return c.JSON(http.StatusOK, struct {
		Captures []Capture `json:"captures"`
	}{list})
}

// stats is GET /stats.
func (p *Provider) stats(c echo.Context) error {
	f, err := filterOf(c)
	if err != nil {
		return p.fail(c, err)
	}
	s, err := p.cfg.Records.Stats(c.Request().Context(), f)
	if err != nil {
		return p.fail(c, err)
	}
	return c.JSON(http.StatusOK, StatsReport{Stats: s, Counters: p.Counters()})
}

// resetNamespace is DELETE /namespaces/:ns: the namespace's records go,
// its standing faults stay.
func (p *Provider) resetNamespace(c echo.Context) error {
	ns, err := namespaceParam(c.Param("ns"), true)
	if err != nil {
		return p.fail(c, err)
	}
	if err := p.cfg.Records.Reset(c.Request().Context(), ns); err != nil {
		return p.fail(c, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// resetAll is DELETE /records.
func (p *Provider) resetAll(c echo.Context) error {
	if err := p.cfg.Records.Reset(c.Request().Context(), ""); err != nil {
		return p.fail(c, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// putFaults is PUT /faults/:ns: the body replaces the standing faults.
func (p *Provider) putFaults(c echo.Context) error {
	ns, err := namespaceParam(c.Param("ns"), true)
	if err != nil {
		return p.fail(c, err)
	}
	var f Faults
	if err := decodeStrict(c, &f); err != nil {
		return p.fail(c, err)
	}
	if err := f.Validate(); err != nil {
		return p.fail(c, invalidBody("%v", err))
	}
	p.mu.Lock()
	if f == (Faults{}) {
		delete(p.faults, lab.Namespace(ns))
	} else {
		p.faults[lab.Namespace(ns)] = f
	}
	p.mu.Unlock()
	return c.JSON(http.StatusOK, f)
}

// getFaults is GET /faults/:ns.
func (p *Provider) getFaults(c echo.Context) error {
	ns, err := namespaceParam(c.Param("ns"), true)
	if err != nil {
		return p.fail(c, err)
	}
	return c.JSON(http.StatusOK, p.standing(lab.Namespace(ns)))
}

// deleteFaults is DELETE /faults/:ns.
func (p *Provider) deleteFaults(c echo.Context) error {
	ns, err := namespaceParam(c.Param("ns"), true)
	if err != nil {
		return p.fail(c, err)
	}
	p.mu.Lock()
	delete(p.faults, lab.Namespace(ns))
	p.mu.Unlock()
	return c.NoContent(http.StatusNoContent)
}

// health is GET /health.
func (p *Provider) health(c echo.Context) error {
	return c.JSON(http.StatusOK, struct {
		Status string `json:"status"`
	}{"ok"})
}
