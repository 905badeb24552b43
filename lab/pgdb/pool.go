package pgdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-lab/lab/lab"
)

// Pool is one replica's PostgreSQL pool, shared by every store on it.
// Whatever store or path takes a connection takes it for a namespace, so
// the budget is one per namespace per pool, not one per store:
//
//   - a namespace holds at most a quarter of the pool at once;
//   - of those, only a few may be held across slow work (a transaction kept
//     open through an injected pause), and all namespaces together hold at
//     most half the pool that way, so attendees who hold several
//     namespaces still leave the other half to short charges;
//   - the background (the sweeper; namespace "") keeps a reserve that
//     attendees never reach;
//   - the last few connections attendees may have go only to a namespace
//     holding none, so however many namespaces one attendee holds (a join
//     code admits many), another attendee's charge still finds one.
//
// A connection that cannot be had within the caller's deadline is
// lab.ErrStoreUnavailable, naming the limit that was hit.
type Pool struct {
	pool   *pgxpool.Pool
	budget Budget

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced whenever a connection is given back
	held      map[lab.Namespace]int
	heldSlow  map[lab.Namespace]int
	attendees int // connections held by namespaces, background apart
	slow      int // connections held across slow work, every namespace's
	peak      map[lab.Namespace]int
	peakSlow  map[lab.Namespace]int
	serving   map[lab.Namespace]map[uint32]int // the backends each namespace holds now
}

// Budget says how many of a pool's connections each kind of holder may
// have at once; NewPool derives it from the pool's size.
type Budget struct {
	PerNamespace     int // every connection of one namespace: a quarter of the pool
	SlowPerNamespace int // of those, held across slow work: a tenth of the pool
	SlowTotal        int // across slow work, all namespaces together: half the pool
	Reserve          int // kept for the background: a tenth of the pool
	Headroom         int // of the attendees' part, kept for a namespace holding none: a tenth of the pool
}

// BudgetFor is the budget of a pool of size connections.
func BudgetFor(size int) Budget {
	return Budget{
		PerNamespace:     max(1, size/4),
		SlowPerNamespace: max(1, size/10),
		SlowTotal:        max(1, size/2),
		Reserve:          max(1, size/10),
		Headroom:         max(1, size/10),
	}
}

// NewPool wraps pool with the budget its size gives.
func NewPool(pool *pgxpool.Pool) *Pool {
	return &Pool{pool: pool, budget: BudgetFor(int(pool.Config().MaxConns)), changed: make(chan struct{}),
		held: map[lab.Namespace]int{}, heldSlow: map[lab.Namespace]int{}, peak: map[lab.Namespace]int{}, peakSlow: map[lab.Namespace]int{},
		serving: map[lab.Namespace]map[uint32]int{}}
}

// Background is the namespace of the lab's own work (the sweeper, a
// restart of every namespace): it draws on the reserve.
const Background lab.Namespace = ""

// Use says how a connection will be held.
type Use bool

// Uses of a connection.
const (
	Short      Use = false // statements and transactions that never wait on slow work
	AcrossWork Use = true  // a transaction held open through the attempt's slow work
)

// Conn is a connection held for a namespace; Release gives it back to the
// pool and the namespace's budget.
type Conn struct {
	*pgxpool.Conn
	release func()
	waited  bool
	pool    *Pool
	ns      lab.Namespace
	mu      sync.Mutex
	use     Use
}

// Release gives the connection back.
func (c *Conn) Release() { c.release() }

// HoldAcrossWork says the connection will now be held through slow work
// (its transaction won a claim and pauses), waiting for an across-work slot
// of its namespace and of the replica until ctx ends.
func (c *Conn) HoldAcrossWork(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.use == AcrossWork {
		return nil
	}
	if err := c.pool.promote(ctx, c.ns); err != nil {
		return err
	}
	c.use = AcrossWork
	return nil
}

// Waited reports whether the namespace's budget made it queue: its twins
// may have finished meanwhile.
func (c *Conn) Waited() bool { return c.waited }

// Acquire takes a connection for ns, waiting while its budget (or the
// pool) is full, until ctx ends.
func (p *Pool) Acquire(ctx context.Context, ns lab.Namespace, use Use) (*Conn, error) {
	waited, err := p.take(ctx, ns, use)
	if err != nil {
		return nil, err
	}
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		p.give(ns, use, 0)
		if errors.Is(err, context.DeadlineExceeded) && !errors.Is(ctx.Err(), context.Canceled) {
			return nil, fmt.Errorf("%w: no PostgreSQL connection of this replica could be had in time (all busy, or a new one took longer)", lab.ErrStoreUnavailable)
		}
		return nil, fmt.Errorf("error acquiring connection: %w", err)
	}
	pid := c.Conn().PgConn().PID()
	p.mu.Lock()
	if p.serving[ns] == nil {
		p.serving[ns] = map[uint32]int{}
	}
	p.serving[ns][pid]++
	p.mu.Unlock()
	var once sync.Once
	conn := &Conn{Conn: c, waited: waited, pool: p, ns: ns, use: use}
	conn.release = func() {
		once.Do(func() {
			c.Release()
			conn.mu.Lock()
			use := conn.use
			conn.mu.Unlock()
			p.give(ns, use, pid)
		})
	}
	return conn, nil
}

// take reserves a slot of ns's budget, waiting for one until ctx ends;
// waited says whether it had to.
func (p *Pool) take(ctx context.Context, ns lab.Namespace, use Use) (waited bool, err error) {
	for ; ; waited = true {
		p.mu.Lock()
		limit := p.overLocked(ns, use)
		if limit == "" {
			p.held[ns]++
			p.peak[ns] = max(p.peak[ns], p.held[ns])
			if ns != Background {
				p.attendees++
			}
			if use == AcrossWork {
				p.heldSlow[ns]++
				p.slow++
				p.peakSlow[ns] = max(p.peakSlow[ns], p.heldSlow[ns])
			}
			p.mu.Unlock()
			return waited, nil
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return waited, ctx.Err()
			}
			return waited, fmt.Errorf("%w: %s", lab.ErrStoreUnavailable, limit)
		}
	}
}

// promote moves one of ns's connections to across work, waiting for a slot.
func (p *Pool) promote(ctx context.Context, ns lab.Namespace) error {
	for {
		p.mu.Lock()
		limit := ""
		switch {
		case ns == Background:
		case p.heldSlow[ns] >= p.budget.SlowPerNamespace:
			limit = fmt.Sprintf("this namespace already holds %d PostgreSQL connections of this replica across slow work, its most", p.budget.SlowPerNamespace)
		case p.slow >= p.budget.SlowTotal:
			limit = fmt.Sprintf("%d PostgreSQL connections of this replica are already held across slow work, the most all namespaces may", p.budget.SlowTotal)
		}
		if limit == "" {
			p.heldSlow[ns]++
			p.slow++
			p.peakSlow[ns] = max(p.peakSlow[ns], p.heldSlow[ns])
			p.mu.Unlock()
			return nil
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return ctx.Err()
			}
			return fmt.Errorf("%w: %s", lab.ErrStoreUnavailable, limit)
		}
	}
}

// overLocked says which limit a new connection of ns would pass, "" when
// none.
func (p *Pool) overLocked(ns lab.Namespace, use Use) string {
	b := p.budget
	size := int(p.pool.Config().MaxConns)
	switch {
	case ns == Background:
		return "" // the reserve is what attendees leave; the pool itself bounds the rest
	case p.held[ns] >= b.PerNamespace:
		return fmt.Sprintf("this namespace already holds its %d PostgreSQL connections of this replica", b.PerNamespace)
	case use == AcrossWork && p.heldSlow[ns] >= b.SlowPerNamespace:
		return fmt.Sprintf("this namespace already holds %d PostgreSQL connections of this replica across slow work, its most", b.SlowPerNamespace)
	case use == AcrossWork && p.slow >= b.SlowTotal:
		return fmt.Sprintf("%d PostgreSQL connections of this replica are already held across slow work, the most all namespaces may", b.SlowTotal)
	case p.attendees >= size-b.Reserve:
		return fmt.Sprintf("every PostgreSQL connection of this replica but the %d kept for the lab's own work is taken", b.Reserve)
	case p.held[ns] > 0 && p.attendees >= size-b.Reserve-b.Headroom:
		return fmt.Sprintf("the replica's last %d PostgreSQL connections for attendees are kept for namespaces that hold none", b.Headroom)
	}
	return ""
}

// give returns a slot of ns's budget and wakes the waiters.
func (p *Pool) give(ns lab.Namespace, use Use, pid uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[ns]--; p.held[ns] == 0 {
		delete(p.held, ns)
	}
	if ns != Background {
		p.attendees--
	}
	if use == AcrossWork {
		if p.heldSlow[ns]--; p.heldSlow[ns] == 0 {
			delete(p.heldSlow, ns)
		}
		p.slow--
	}
	if pid != 0 {
		if p.serving[ns][pid]--; p.serving[ns][pid] == 0 {
			delete(p.serving[ns], pid)
		}
		if len(p.serving[ns]) == 0 {
			delete(p.serving, ns)
		}
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// Holding is what one namespace holds of a pool, now and at most so far.
type Holding struct {
	Now, Peak                  int // every connection
	AcrossWork, PeakAcrossWork int // of those, held across slow work
}

// Held is what ns holds of the pool.
func (p *Pool) Held(ns lab.Namespace) Holding {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Holding{Now: p.held[ns], Peak: p.peak[ns], AcrossWork: p.heldSlow[ns], PeakAcrossWork: p.peakSlow[ns]}
}

// Budget is the pool's budget.
func (p *Pool) Budget() Budget { return p.budget }

// Serving lists the backends holding ns's connections now.
func (p *Pool) Serving(ns lab.Namespace) []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var pids []int32
	for pid := range p.serving[ns] {
		pids = append(pids, int32(pid))
	}
	slices.Sort(pids)
	return pids
}

// Exec runs one statement on a connection of ns's.
func (p *Pool) Exec(ctx context.Context, ns lab.Namespace, sql string, args ...any) (pgconn.CommandTag, error) {
	c, err := p.Acquire(ctx, ns, Short)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer c.Release()
	return c.Exec(ctx, sql, args...)
}

// QueryRow runs a query of one row on a connection of ns's, given back once
// the row is scanned.
func (p *Pool) QueryRow(ctx context.Context, ns lab.Namespace, sql string, args ...any) pgx.Row {
	c, err := p.Acquire(ctx, ns, Short)
	if err != nil {
		return errRow{err}
	}
	return &releasingRow{row: c.QueryRow(ctx, sql, args...), conn: c}
}

// Query runs a query on a connection of ns's, given back when the rows are
// closed (pgx.CollectRows closes them).
func (p *Pool) Query(ctx context.Context, ns lab.Namespace, sql string, args ...any) (pgx.Rows, error) {
	c, err := p.Acquire(ctx, ns, Short)
	if err != nil {
		return nil, err
	}
	rows, err := c.Query(ctx, sql, args...)
	if err != nil {
		c.Release()
		return nil, err
	}
	return &releasingRows{Rows: rows, conn: c}, nil
}

// BeginTxFunc runs fn in a transaction on a connection of ns's.
func (p *Pool) BeginTxFunc(ctx context.Context, ns lab.Namespace, use Use, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	c, err := p.Acquire(ctx, ns, use)
	if err != nil {
		return err
	}
	defer c.Release()
	return pgx.BeginTxFunc(ctx, c, opts, fn)
}

// Raw is the pool underneath, for what is no namespace's: pings, resets,
// migrations and configuration.
func (p *Pool) Raw() *pgxpool.Pool { return p.pool }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type releasingRow struct {
	row  pgx.Row
	conn *Conn
}

func (r *releasingRow) Scan(dest ...any) error {
	defer r.conn.Release()
	return r.row.Scan(dest...)
}

type releasingRows struct {
	pgx.Rows
	conn *Conn
}

func (r *releasingRows) Close() {
	r.Rows.Close()
	r.conn.Release()
}
