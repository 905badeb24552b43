package api

// The stepper's routes: a stepped run started, advanced move by move or by
// a whole schedule, and read back with the ledger's charges for its key;
// and the gate that a stepped attempt's Lab-Step header puts in its
// request's context.

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/api/wire"
	"github.com/idempotency-lab/lab/lab/labsvc"
	"github.com/idempotency-lab/lab/lab/step"
)

// stepAnswer is a stepped run as the routes answer it.
type stepAnswer struct {
	step.View
	// Ledger is what the books hold for the run's key, read after the move.
	Ledger stepLedger `json:"ledger"`
	Error  string     `json:"error,omitempty"` // why the last move could not be made
}

// stepLedger is the books' charges for a stepped run's key.
type stepLedger struct {
	Charges   int      `json:"charges"`
	ChargeIDs []string `json:"charge_ids"`
	Cents     int64    `json:"cents"`
}

// schedulesAnswer lists the named schedules.
type schedulesAnswer struct {
	// Current is the caller's stepped run in progress, "" for none.
	Current string `json:"current"`
	// StoreEvents are the time-driven moves each available design has.
	StoreEvents map[lab.StoreName][]lab.TimeEvent `json:"store_events"`
	Schedules   []step.Schedule                   `json:"schedules"`
	Points      []lab.PausePoint                  `json:"points"`
	Events      []lab.TimeEventSpec               `json:"events"`
	Faults      []lab.FaultPoint                  `json:"faults"` // the faults a stepped run takes; time-driven ones are moves
	Note        string                            `json:"note"`
}

// listSchedules is GET /lab/step.
func (s *Server) listSchedules(c echo.Context) error {
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	current := ""
	if run, ok := s.deps.Service.CurrentStep(who.Namespace); ok {
		current = run.ID()
	}
	return c.JSON(http.StatusOK, schedulesAnswer{
		Current: current, StoreEvents: s.deps.Service.StepMoves(),
		Schedules: step.Schedules(),
		Points: []lab.PausePoint{lab.PointBeforeClaim, lab.PointAfterClaim, lab.PointAfterWork, lab.PointAfterCharge,
			lab.PointBeforeResponseStored, lab.PointBeforeReplayRead, lab.PointAfterProviderCall, lab.PointAfterFinish},
		Events: lab.TimeEvents(),
		Faults: []lab.FaultPoint{lab.FaultCrashAfterClaim, lab.FaultCrashAfterCharge, lab.FaultOutboxFail, lab.FaultFailover, lab.FaultPGFailover,
			lab.FaultCrashAfterPhase, lab.FaultAppliedResponseLost},
		Note: "POST /lab/step?schedule=<name> plays one (play=none opens it to advance by hand); " +
			"POST /lab/step?store=&attempts=&replicas= starts a run to advance with attempt=, event=, schedule=1,2,ttl or seed=",
	})
}

// startStep is POST /lab/step.
func (s *Server) startStep(c echo.Context) error {
	who, err := s.who(c.Request(), true)
	if err != nil {
		return err
	}
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	var req labsvc.StepRequest
	if req.Schedule, err = q.Name("schedule", ""); err != nil {
		return err
	}
	if req.Schedule != "" {
		for _, p := range []string{"store", "attempts", "replicas", "fault", "ttl_ms", "window_ms", "replication", "phase"} {
			if _, present, _ := q.Lookup(p); present {
				return lab.Invalid(p, "comes with the named schedule: give schedule alone (and play)")
			}
		}
		play, err := q.Choice("play", "all", "all", "none")
		if err != nil {
			return err
		}
		req.Play = play == "all"
		if sched, ok := step.FindSchedule(req.Schedule); ok && sched.Faults != "" {
			if err := s.requireFaults(); err != nil {
				return err // its store parameters travel in the Lab-Fault header
			}
		}
	} else {
		if _, present, _ := q.Lookup("play"); present {
			return lab.Invalid("play", "plays a named schedule: give schedule=<name>")
		}
		if req.Faults, err = s.stepFaults(q); err != nil {
			return err
		}
		store, err := q.Name("store", string(s.cfg.DefaultStore))
		if err != nil {
			return err
		}
		req.Store = lab.StoreName(store)
		attempts, err := q.Int("attempts", 2, step.MinAttempts, step.MaxAttempts)
		if err != nil {
			return err
		}
		replicas, err := q.Int("replicas", 1, 1, int64(s.deps.Service.Replicas().MaxReplicas()))
		if err != nil {
			return err
		}
		req.Attempts, req.Replicas = int(attempts), int(replicas)
	}
	run, err := s.deps.Service.StartStep(c.Request().Context(), who.Identity, req)
	if err != nil && run == nil {
		return stepProblem(err)
	}
	return s.answerStep(c, http.StatusCreated, who.Tenant, run, err)
}

// stepRun is GET /lab/step/{id}.
func (s *Server) stepRun(c echo.Context) error {
	who, run, err := s.findStep(c)
	if err != nil {
		return err
	}
	return s.answerStep(c, http.StatusOK, who.Tenant, run, nil)
}

// advanceStep is POST /lab/step/{id}/advance?attempt=N or ?schedule=2,1,….
func (s *Server) advanceStep(c echo.Context) error {
	who, run, err := s.findStep(c)
	if err != nil {
		return err
	}
	q, err := wire.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return err
	}
	n := run.Spec().Attempts
	var given []string
	for _, p := range []string{"attempt", "event", "schedule", "seed"} {
		if _, present, _ := q.Lookup(p); present {
			given = append(given, p)
		}
	}
	if len(given) != 1 {
		return lab.Invalid("attempt", "give exactly one of attempt=1..%d, event=<name>, schedule=1,2,ttl,… or seed=<n> (got %d)", n, len(given))
	}
	var moveErr error
	switch given[0] {
	case "attempt":
		a, err := q.Int("attempt", 0, 1, int64(n))
		if err != nil {
			return err
		}
		moveErr = run.Advance(c.Request().Context(), step.A(int(a)))
	case "event":
		raw, _, _ := q.Lookup("event")
		e, err := step.ParseEvent("event", raw)
		if err != nil {
			return err
		}
		moveErr = run.Advance(c.Request().Context(), step.E(e))
	case "schedule":
		raw, _, _ := q.Lookup("schedule")
		moves, err := step.ParseMoves(raw, n)
		if err != nil {
			return err
		}
		moveErr = run.Play(c.Request().Context(), moves)
	case "seed":
		seed, err := q.Int("seed", 0, 0, 1<<53)
		if err != nil {
			return err
		}
		moveErr = run.PlaySeed(c.Request().Context(), uint64(seed))
	}
	var invalid *lab.InvalidError
	if errors.As(moveErr, &invalid) {
		return moveErr
	}
	return s.answerStep(c, http.StatusOK, who.Tenant, run, moveErr)
}

// stepFaults reads a stepped run's fault and store parameters: a fault of
// the first attempt (not one time drives: the moves stand for those), a
// claim TTL and a retention window for every attempt.
func (s *Server) stepFaults(q wire.Query) (lab.Faults, error) {
	var f lab.Faults
	fault, err := q.Name("fault", "none")
	if err != nil {
		return f, err
	}
	_, ttlGiven, _ := q.Lookup("ttl_ms")
	_, windowGiven, _ := q.Lookup("window_ms")
	if _, present, _ := q.Lookup("replication"); present && fault != string(lab.FaultPGFailover) {
		return f, lab.Invalid("replication", "belongs to fault pg_failover")
	}
	if _, present, _ := q.Lookup("phase"); present && fault != string(lab.FaultCrashAfterPhase) {
		return f, lab.Invalid("phase", "belongs to fault crash_after_phase")
	}
	if fault == "none" && !ttlGiven && !windowGiven {
		return f, nil
	}
	if err := s.requireFaults(); err != nil {
		return f, err
	}
	if fault != "none" {
		if f.Point, err = lab.ParseFaultPoint("fault", fault); err != nil {
			return f, err
		}
	}
	if f.Point == lab.FaultPGFailover {
		if f.Replication, err = replicationParam(q); err != nil { // every attempt charges on the pair
			return f, err
		}
	}
	if f.Point == lab.FaultCrashAfterPhase {
		phase, err := q.Int("phase", lab.DefaultCrashPhase, 1, lab.MaxCrashPhase)
		if err != nil {
			return f, err
		}
		f.Phase = int(phase)
	}
	if ttlGiven {
		ttl, err := q.Int("ttl_ms", 0, 1, 600_000)
		if err != nil {
			return f, err
		}
		f.ClaimTTL = time.Duration(ttl) * time.Millisecond
	}
	if windowGiven {
		w, err := q.Int("window_ms", 0, 1, 86_400_000)
		if err != nil {
			return f, err
		}
		f.Retention = time.Duration(w) * time.Millisecond
	}
	return f, nil
}

// abortStep is POST /lab/step/{id}/abort: the run ends now, as its idle
// bound would end it, and the answer is where it stood.
func (s *Server) abortStep(c echo.Context) error {
	who, run, err := s.findStep(c)
	if err != nil {
		return err
	}
	run.Abort("aborted by the caller")
	return s.answerStep(c, http.StatusOK, who.Tenant, run, nil)
}

// findStep resolves the caller and the stepped run of its namespace.
func (s *Server) findStep(c echo.Context) (caller, *step.Run, error) {
	who, err := s.who(c.Request(), true)
	if err != nil {
		return caller{}, nil, err
	}
	run, err := s.deps.Service.FindStep(who.Namespace, c.Param("id"))
	if err != nil {
		return caller{}, nil, stepProblem(err)
	}
	return who, run, nil
}

// answerStep answers where run stands, with the books' charges for its key.
func (s *Server) answerStep(c echo.Context, status int, tenant string, run *step.Run, moveErr error) error {
	v := run.View()
	tally, err := s.deps.Service.StepCharges(c.Request().Context(), tenant, v)
	if err != nil {
		return fmt.Errorf("%w: error reading the key's charges: %w", lab.ErrStoreUnavailable, err)
	}
	ans := stepAnswer{View: v, Ledger: stepLedger{Charges: tally.Charges, ChargeIDs: tally.IDs, Cents: tally.Cents}}
	if ans.Ledger.ChargeIDs == nil {
		ans.Ledger.ChargeIDs = []string{}
	}
	if moveErr != nil {
		ans.Error = moveErr.Error()
		status = http.StatusConflict
	}
	return c.JSON(status, ans)
}

// stepProblem maps the stepper's errors to problems.
func stepProblem(err error) error {
	switch {
	case errors.Is(err, step.ErrNotFound):
		return problem(http.StatusNotFound, "step_not_found", "Stepped run not found", err.Error())
	case errors.Is(err, step.ErrRunning):
		return problem(http.StatusConflict, "step_in_progress", "Stepped run in progress", err.Error())
	case errors.Is(err, labsvc.ErrSteppingOff):
		return problem(http.StatusNotFound, "stepping_off", "Stepping unavailable", err.Error())
	}
	return err
}

// stepGate puts a stepped attempt's gate in its request's context, from
// its Lab-Step header: the stepper holds it at the store's pause points. A
// header that names no stepped run of the caller's namespace is refused.
func (s *Server) stepGate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h, err := wire.OneField(step.Header, c.Request().Header.Values(step.Header))
		if err != nil {
			return err
		}
		if h == "" {
			return next(c)
		}
		if err := lab.CheckText(step.Header, h, 64); err != nil {
			return err
		}
		who, err := s.who(c.Request(), false)
		if err != nil {
			return err
		}
		g, err := s.deps.Service.StepGate(who.Namespace, h)
		if err != nil {
			return err
		}
		c.SetRequest(c.Request().WithContext(lab.WithStepGate(c.Request().Context(), g)))
		return next(c)
	}
}
