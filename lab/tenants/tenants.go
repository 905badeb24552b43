// Package tenants is the lab's directory of bearer tokens. Every token names
// a tenant, and every tenant belongs to a namespace: the part of the lab one
// attendee owns. A namespace has two tenants, its own and a second one for
// the "two tenants, one key" scenario, whose token is derived from the
// first, so every process of a cluster resolves both without sharing more
// than the first.
package tenants

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/idempotency-lab/lab/lab"
)

// Identity is who a token speaks for.
type Identity struct {
	Tenant    string
	Namespace lab.Namespace
	Token     string // the bearer token itself, for the runner's requests
}

// Second is the namespace's other tenant, and the token that speaks for it.
// Asked of the second tenant, it answers the second tenant itself.
func (id Identity) Second() Identity {
	if id.Tenant != string(id.Namespace) {
		return id
	}
	return Identity{Tenant: id.Tenant + lab.SecondTenantSuffix, Namespace: id.Namespace, Token: SecondToken(id.Namespace, id.Token)}
}

// SecondToken derives the token of a namespace's second tenant from the
// first tenant's token: whoever holds the first may act as the second.
func SecondToken(ns lab.Namespace, token string) string {
	sum := sha256.Sum256([]byte("idempotency-lab second tenant|" + string(ns) + "|" + token))
	return "second-" + hex.EncodeToString(sum[:16])
}

// Joined keeps the tokens attendees received from Join, by their hash.
type Joined interface {
	// Add records a joined tenant under the hash of its token.
	Add(ctx context.Context, tokenHash, tenant string) error
	// Lookup finds the tenant of a token's hash.
	Lookup(ctx context.Context, tokenHash string) (tenant string, ok bool, err error)
	// Count tells how many tenants joined.
	Count(ctx context.Context) (int, error)
}

// Why a join is refused: the code given is not the lab's, or the lab takes
// no more attendees.
var (
	ErrJoinCode   = errors.New("the join code is wrong")
	ErrJoinClosed = errors.New("joining is closed")
)

// Directory resolves tokens: the configured ones, their second tenants, and
// the attendees who joined.
type Directory struct {
	static   map[string]Identity // by token, the configured tenants and their second tenants
	joined   Joined
	code     string // join code; "" lets anyone join
	maxJoins int
}

// NewDirectory builds a directory of the configured tenants (token →
// tenant) over joined. A tenant name must be a namespace name: it cannot
// contain the second tenant's suffix.
func NewDirectory(configured map[string]string, joined Joined, joinCode string, maxJoins int) (*Directory, error) {
	d := &Directory{static: map[string]Identity{}, joined: joined, code: joinCode, maxJoins: maxJoins}
	for token, tenant := range configured {
		if err := lab.CheckNamespace(tenant); err != nil {
			return nil, fmt.Errorf("tenant %q: %w", tenant, err)
		}
		id := Identity{Tenant: tenant, Namespace: lab.Namespace(tenant), Token: token}
		d.static[token] = id
		second := id.Second()
		d.static[second.Token] = second
	}
	return d, nil
}

// Resolve finds who token speaks for.
func (d *Directory) Resolve(ctx context.Context, token string) (Identity, bool, error) {
	for t, id := range d.static {
		if subtle.ConstantTimeCompare([]byte(t), []byte(token)) == 1 {
			return id, true, nil
		}
	}
	// Joined tenants, the second ones included, are kept by token hash.
	tenant, ok, err := d.joined.Lookup(ctx, hash(token))
	if err != nil || !ok {
		return Identity{}, false, err
	}
	return Identity{Tenant: tenant, Namespace: lab.NamespaceOf(tenant), Token: token}, true, nil
}

// Join gives a new attendee a namespace of their own, when code matches the
// lab's join code (or the lab has none).
func (d *Directory) Join(ctx context.Context, code string) (Identity, error) {
	if d.code != "" && subtle.ConstantTimeCompare([]byte(code), []byte(d.code)) != 1 {
		return Identity{}, fmt.Errorf("%w: ask the instructor for the workshop's code", ErrJoinCode)
	}
	n, err := d.joined.Count(ctx)
	if err != nil {
		return Identity{}, fmt.Errorf("error counting attendees: %w", err)
	}
	if n >= d.maxJoins {
		return Identity{}, fmt.Errorf("%w: the lab already has %d attendees", ErrJoinClosed, n)
	}
	raw := make([]byte, 16)
	_, _ = rand.Read(raw) // never fails (crypto/rand)
	tenant := "att-" + hex.EncodeToString(raw[:5])
	id := Identity{Tenant: tenant, Namespace: lab.Namespace(tenant), Token: "lab-" + hex.EncodeToString(raw)}
	if err := d.joined.Add(ctx, hash(id.Token), tenant); err != nil {
		return Identity{}, fmt.Errorf("error recording the attendee: %w", err)
	}
	second := id.Second()
	if err := d.joined.Add(ctx, hash(second.Token), second.Tenant); err != nil {
		return Identity{}, fmt.Errorf("error recording the attendee: %w", err)
	}
	return id, nil
}

// hash keeps tokens out of storage: only their SHA-256 is kept.
func hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// InMemory keeps joined tenants in this process (every in-process replica
// shares it), when no PostgreSQL is configured.
type InMemory struct {
	mu      sync.Mutex
	tenants map[string]string
}

// NewInMemory returns an empty in-process store of joined tenants.
func NewInMemory() *InMemory { return &InMemory{tenants: map[string]string{}} }

// Add records a tenant.
func (m *InMemory) Add(_ context.Context, tokenHash, tenant string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tenants[tokenHash] = tenant
	return nil
}

// Lookup finds a tenant.
func (m *InMemory) Lookup(_ context.Context, tokenHash string) (string, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.tenants[tokenHash]
	return t, ok, nil
}

// Count counts attendees (each has two tenants).
func (m *InMemory) Count(context.Context) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.tenants) / 2, nil
}
