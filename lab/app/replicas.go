package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/idempotency-lab/lab/lab"
)

// replicaSet is the lab's replicas as a run reaches them: this process's
// primary and the in-process replicas it starts on demand, or the primary
// and the peer processes of a cluster. Each replica's use cases reach the
// others through it (labsvc.Replicas).
type replicaSet struct {
	basePath string
	peers    []string // base URLs of peer processes (cluster mode)
	max      int      // in-process replicas a run may use
	client   *http.Client
	failover *redisFailover
	// start opens one more in-process replica on ln.
	start func(ctx context.Context, name string, ln net.Listener) (*replica, error)

	growing sync.Mutex // serialises starting replicas; held during their I/O
	mu      sync.Mutex // guards what follows; never held during I/O
	primary *replica
	extra   []*replica
}

// all is every in-process replica, the primary first.
func (s *replicaSet) all() []*replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.primary == nil {
		return nil
	}
	return append([]*replica{s.primary}, s.extra...)
}

// StoresAt is the stores of the in-process replica at target.
func (s *replicaSet) StoresAt(target string) (map[lab.StoreName]lab.Store, bool) {
	base := strings.TrimSuffix(s.basePath, "/")
	for _, r := range s.all() {
		if r.url+base == target {
			return r.stores, true
		}
	}
	return nil, false
}

// Targets returns n replicas' base URLs: the primary first, then peers or
// in-process replicas started on loopback ports as needed.
func (s *replicaSet) Targets(ctx context.Context, n int) ([]string, error) {
	base := strings.TrimSuffix(s.basePath, "/")
	all := s.all()
	if len(all) == 0 {
		return nil, fmt.Errorf("%w: the lab is still starting", lab.ErrStoreUnavailable)
	}
	urls := []string{all[0].url + base}
	if len(s.peers) > 0 {
		if n > 1+len(s.peers) {
			return nil, lab.Invalid("replicas", "must be in 1..%d: this cluster has %d peer(s)", 1+len(s.peers), len(s.peers))
		}
		return append(urls, s.peers[:n-1]...), nil
	}
	s.growing.Lock()
	defer s.growing.Unlock()
	for have := len(s.all()) - 1; have < n-1; have++ {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("error listening for a replica: %w", err)
		}
		r, err := s.start(ctx, fmt.Sprintf("r%d", have+2), ln)
		if err != nil {
			_ = ln.Close()
			return nil, err
		}
		s.mu.Lock()
		s.extra = append(s.extra, r)
		s.mu.Unlock()
	}
	for _, r := range s.all()[1:n] {
		urls = append(urls, r.url+base)
	}
	return urls, nil
}

// MaxReplicas is how many replicas a run may spread over.
func (s *replicaSet) MaxReplicas() int {
	if len(s.peers) > 0 {
		return 1 + len(s.peers)
	}
	return s.max
}

// PairUnavailable says why the failover fault cannot run ("" when it can).
func (s *replicaSet) PairUnavailable() string { return s.failover.Unavailable() }

// ResetOthers makes every replica but self forget a namespace's keys and
// runs ("" for every namespace): in-process replicas are told the
// namespace; peers are asked through their own /reset-lab with the
// caller's credentials, which their API resolves for itself.
func (s *replicaSet) ResetOthers(ctx context.Context, self string, ns lab.Namespace, credentials string) error {
	for _, r := range s.all() {
		if r.name == self {
			continue
		}
		if err := r.service.ResetLocal(ctx, ns); err != nil {
			return fmt.Errorf("error resetting replica %s: %w", r.name, err)
		}
	}
	for _, peer := range s.peers {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, peer+"/reset-lab?local=true&all="+strconv.FormatBool(ns == ""), nil)
		if err != nil {
			return fmt.Errorf("error building the reset of peer %s: %w", peer, err)
		}
		if credentials != "" {
			req.Header.Set("Authorization", credentials)
		}
		resp, err := s.client.Do(req)
		if err != nil {
			return fmt.Errorf("error resetting peer %s: %w", peer, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("error resetting peer %s: status %d", peer, resp.StatusCode)
		}
	}
	return nil
}
