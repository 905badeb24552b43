package labsvc

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/grade"
	"github.com/idempotency-lab/lab/lab/tenants"
)

// ErrCheckRunning refuses a second check of a design in one namespace at
// once: a check is a burst of requests, not a load test.
var ErrCheckRunning = errors.New("this namespace is already checking a design on this replica; wait for it to end")

// CheckDesign grades one of the lab's own designs as lab check grades any
// API: the suite sent over real HTTP to this replica's POST /charges?store=,
// as id (and, for the case that holds keys per client, as the namespace's
// other tenant). With faults on, the in-flight case makes its first
// attempt slow with the lab's own fault header. Arbitrary targets stay on
// the command line: a shared server aims its checks at itself only.
func (s *Service) CheckDesign(ctx context.Context, id tenants.Identity, store lab.StoreName, faults bool) (grade.Report, error) {
	if _, err := s.Store(store); err != nil {
		return grade.Report{}, err
	}
	second := id.Second() // the namespace's other tenant, for the case that holds keys per client
	if second.Tenant == id.Tenant {
		return grade.Report{}, lab.Invalid("Authorization", "a check runs as a namespace's first tenant; this token is its second")
	}
	s.mu.Lock()
	if s.checking[id.Namespace] {
		s.mu.Unlock()
		return grade.Report{}, ErrCheckRunning
	}
	s.checking[id.Namespace] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.checking, id.Namespace)
		s.mu.Unlock()
	}()
	release, err := s.admitRun(id.Namespace)
	if err != nil {
		return grade.Report{}, err
	}
	defer release()
	targets, err := s.cfg.Replicas.Targets(ctx, 1)
	if err != nil {
		return grade.Report{}, err
	}
	cfg := grade.Config{
		Target: targets[0] + "/charges?store=" + url.QueryEscape(string(store)),
		Token:  id.Token, Token2: second.Token, ReplayHeader: "Idempotent-Replayed",
		// The ledger's charges under a key: what shows a second charge no
		// answer names.
		ReadBack:    targets[0] + "/charges?store=" + url.QueryEscape(string(store)) + "&key={key}",
		ReadBackIDs: "/charges",
		Timeout:     time.Minute,
	}
	if faults {
		cfg.SlowHeader = http.Header{lab.FaultHeader: {"slow;work_ms=300"}}
	}
	return grade.Run(ctx, cfg)
}
