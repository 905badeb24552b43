package labsvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/experiment"
	"github.com/idempotency-lab/lab/lab/step"
	"github.com/idempotency-lab/lab/lab/tenants"
)

// ErrSteppingOff says this server steps no runs.
var ErrSteppingOff = errors.New("this server steps no runs")

// StepRequest starts a stepped run: a named schedule, which sets the rest,
// or a store with its attempts and replicas.
type StepRequest struct {
	Schedule string
	Store    lab.StoreName
	Attempts int
	Replicas int
}

// StartStep opens a stepped run in id's namespace, and plays its schedule
// when it names one. Its attempts go round-robin to the replicas, as a
// run's do; each is a real POST /charges of id's tenant under a key of the
// stepped run's own.
func (s *Service) StartStep(ctx context.Context, id tenants.Identity, req StepRequest) (*step.Run, error) {
	if s.cfg.Steps == nil {
		return nil, ErrSteppingOff
	}
	var sched step.Schedule
	if req.Schedule != "" {
		var ok bool
		if sched, ok = step.FindSchedule(req.Schedule); !ok {
			return nil, lab.Invalid("schedule", "names no schedule of GET /lab/step (got %q)", req.Schedule)
		}
		req.Store, req.Attempts, req.Replicas = sched.Store, sched.Attempts, sched.Replicas
	}
	if _, err := s.Store(req.Store); err != nil {
		return nil, err
	}
	if max := s.cfg.Replicas.MaxReplicas(); req.Replicas < 1 || req.Replicas > max {
		return nil, lab.Invalid("replicas", "must be in 1..%d (got %d)", max, req.Replicas)
	}
	if req.Attempts < step.MinAttempts || req.Attempts > step.MaxAttempts {
		return nil, lab.Invalid("attempts", "must be in %d..%d for a stepped run (got %d)", step.MinAttempts, step.MaxAttempts, req.Attempts)
	}
	targets, err := s.cfg.Replicas.Targets(ctx, req.Replicas)
	if err != nil {
		return nil, err
	}
	spec := step.Spec{Namespace: id.Namespace, Store: req.Store, Attempts: req.Attempts, Schedule: sched.Name}
	for n := range req.Attempts {
		spec.Replicas = append(spec.Replicas, targets[n%len(targets)])
	}
	run, err := s.cfg.Steps.Start(spec, func(ctx context.Context, n int, key, header string) step.Answer {
		return s.sendStepped(ctx, id, spec.Replicas[n-1], req.Store, key, header)
	})
	if err != nil {
		return nil, err
	}
	if sched.Name != "" {
		if err := run.Play(ctx, sched.Steps); err != nil {
			return run, err
		}
	}
	return run, nil
}

// FindStep is one of ns's stepped runs.
func (s *Service) FindStep(ns lab.Namespace, runID string) (*step.Run, error) {
	if s.cfg.Steps == nil {
		return nil, ErrSteppingOff
	}
	return s.cfg.Steps.Find(ns, runID)
}

// sendStepped sends one stepped attempt as a client would, and reads its answer.
func (s *Service) sendStepped(ctx context.Context, id tenants.Identity, target string, store lab.StoreName, key, header string) step.Answer {
	body := fmt.Sprintf(`{"account":%q,"amount_cents":%d,"currency":"USD"}`, DefaultAccount, DefaultAmount)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/charges?store="+string(store), strings.NewReader(body))
	if err != nil {
		return step.Answer{Error: fmt.Sprintf("error building the request: %v", err)}
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Authorization", "Bearer "+id.Token)
	hr.Header.Set(lab.KeyHeader, key)
	hr.Header.Set(step.Header, header)
	// No client timeout: a stepped attempt waits for its turn as long as
	// the run lives, and the run's end cancels ctx.
	client := &http.Client{Transport: s.cfg.Runner.Client.Transport}
	resp, err := client.Do(hr)
	if err != nil {
		return step.Answer{Error: fmt.Sprintf("error sending the attempt: %v", err)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	ans := step.Answer{Status: resp.StatusCode, Replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		Replica: resp.Header.Get(experiment.ReplicaHeader)}
	if err != nil {
		ans.Error = fmt.Sprintf("error reading the answer: %v", err)
		return ans
	}
	var charge struct {
		ID string `json:"id"`
	}
	if resp.StatusCode < 300 && json.Unmarshal(data, &charge) == nil {
		ans.ChargeID = charge.ID
	}
	return ans
}

// StepGate resolves a stepped attempt's Lab-Step header for a caller of ns.
func (s *Service) StepGate(ns lab.Namespace, header string) (lab.StepGate, error) {
	if s.cfg.Steps == nil {
		return nil, lab.Invalid(step.Header, "this server steps no runs")
	}
	return s.cfg.Steps.Gate(ns, header)
}
