package tenants_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/tenants"
)

func TestMain(m *testing.M) { os.Exit(labtest.WithServices(m).Run()) }

// recording is a Joined that keeps what it was given, to show that only
// token hashes reach storage.
type recording struct {
	tenants.Joined
	mu    sync.Mutex
	added []string // the hashes Add got
}

func (r *recording) Add(ctx context.Context, tokenHash, tenant string) error {
	r.mu.Lock()
	r.added = append(r.added, tokenHash)
	r.mu.Unlock()
	return r.Joined.Add(ctx, tokenHash, tenant)
}

// failing is storage that is down.
type failing struct{ tenants.Joined }

func (failing) Count(context.Context) (int, error) { return 0, errors.New("connection refused") }

// joinedStores are the places joined tenants are kept: in process memory,
// and in PostgreSQL (a schema of the test's own) when it is there.
func joinedStores(t *testing.T) map[string]func(t *testing.T) tenants.Joined {
	t.Helper()
	return map[string]func(t *testing.T) tenants.Joined{
		"memory": func(*testing.T) tenants.Joined { return tenants.NewInMemory() },
		"postgres": func(t *testing.T) tenants.Joined {
			url, schema := labtest.Postgres(t)
			pool, err := pgdb.Open(t.Context(), pgdb.PoolConfig{URL: url, Schema: schema, Size: 2, AppName: "tenants-test", Migrate: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			return pgdb.NewTenants(pool)
		},
	}
}

func resolve(t *testing.T, d *tenants.Directory, token string) (tenants.Identity, bool) {
	t.Helper()
	id, ok, err := d.Resolve(t.Context(), token)
	if err != nil {
		t.Fatalf("resolving %q: %v", token, err)
	}
	return id, ok
}

// TestConfiguredTokens: each configured token speaks for its tenant, in a
// namespace of the tenant's name; the second tenant's token, derived from
// the first, speaks for tenant~2 in the same namespace; no other token
// speaks for anyone.
func TestConfiguredTokens(t *testing.T) {
	t.Parallel()
	d, err := tenants.NewDirectory(map[string]string{"tok-acme": "acme", "tok-globex": "globex"}, tenants.NewInMemory(), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	id, ok := resolve(t, d, "tok-acme")
	if !ok || id != (tenants.Identity{Tenant: "acme", Namespace: "acme", Token: "tok-acme"}) {
		t.Fatalf("tok-acme resolves to %+v (%v)", id, ok)
	}
	second := tenants.SecondToken("acme", "tok-acme")
	if got := id.Second(); got.Token != second || got.Tenant != "acme"+lab.SecondTenantSuffix || got.Namespace != "acme" {
		t.Fatalf("acme's second tenant: %+v", got)
	}
	if sid, ok := resolve(t, d, second); !ok || sid != id.Second() {
		t.Fatalf("the second token resolves to %+v (%v), want %+v", sid, ok, id.Second())
	}
	if id.Second().Second() != id.Second() {
		t.Fatal("the second tenant's second is not itself")
	}
	if g, ok := resolve(t, d, "tok-globex"); !ok || g.Namespace != "globex" {
		t.Fatalf("tok-globex resolves to %+v (%v)", g, ok)
	}
	if tenants.SecondToken("globex", "tok-acme") == second {
		t.Fatal("the second token does not depend on the namespace")
	}
	for _, token := range []string{"", "tok-acm", "tok-acme ", "TOK-ACME", second + "x"} {
		if id, ok := resolve(t, d, token); ok {
			t.Errorf("%q resolves to %+v", token, id)
		}
	}
}

// TestConfiguredTenantsAreNamespaces: a configured tenant's name must be a
// namespace's: never a second tenant's, nor empty, nor odd characters.
func TestConfiguredTenantsAreNamespaces(t *testing.T) {
	t.Parallel()
	for _, tenant := range []string{"", "acme" + lab.SecondTenantSuffix, "ac me", "acme/1", strings.Repeat("a", 33)} {
		if _, err := tenants.NewDirectory(map[string]string{"tok": tenant}, tenants.NewInMemory(), "", 10); err == nil {
			t.Errorf("tenant %q accepted", tenant)
		}
	}
}

// TestJoin: with the join code, each attendee gets a namespace of their
// own and a token that resolves to it, and to its second tenant; only the
// tokens' hashes are kept; the code is checked, and the lab takes no more
// than its limit of attendees. In memory and in PostgreSQL alike.
func TestJoin(t *testing.T) {
	t.Parallel()
	for name, open := range joinedStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := &recording{Joined: open(t)}
			d, err := tenants.NewDirectory(map[string]string{"tok-acme": "acme"}, store, "retry-safely", 2)
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			if _, err := d.Join(ctx, "retry-safe"); !errors.Is(err, tenants.ErrJoinCode) || errors.Is(err, tenants.ErrJoinClosed) {
				t.Fatalf("a wrong code: %v, want ErrJoinCode", err)
			}
			if _, err := d.Join(ctx, ""); !errors.Is(err, tenants.ErrJoinCode) {
				t.Fatalf("no code: %v, want ErrJoinCode", err)
			}
			first, err := d.Join(ctx, "retry-safely")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(first.Tenant, "att-") || string(first.Namespace) != first.Tenant || !strings.HasPrefix(first.Token, "lab-") {
				t.Fatalf("joined as %+v", first)
			}
			if id, ok := resolve(t, d, first.Token); !ok || id != first {
				t.Fatalf("the joined token resolves to %+v (%v), want %+v", id, ok, first)
			}
			if id, ok := resolve(t, d, first.Second().Token); !ok || id.Tenant != first.Tenant+lab.SecondTenantSuffix || id.Namespace != first.Namespace {
				t.Fatalf("the joined second token resolves to %+v (%v)", id, ok)
			}
			second, err := d.Join(ctx, "retry-safely")
			if err != nil {
				t.Fatal(err)
			}
			if second.Namespace == first.Namespace || second.Token == first.Token {
				t.Fatalf("two attendees share %+v and %+v", first, second)
			}
			if _, err := d.Join(ctx, "retry-safely"); !errors.Is(err, tenants.ErrJoinClosed) || !strings.Contains(err.Error(), "2 attendees") {
				t.Fatalf("a third attendee beyond the limit of 2: %v, want ErrJoinClosed", err)
			}
			if n, err := store.Count(ctx); err != nil || n != 2 {
				t.Fatalf("%d attendees kept (%v), want 2", n, err)
			}
			store.mu.Lock()
			defer store.mu.Unlock()
			if len(store.added) != 4 { // two tenants each
				t.Fatalf("%d tokens kept, want 4", len(store.added))
			}
			for _, h := range store.added {
				for _, tok := range []string{first.Token, first.Second().Token, second.Token, second.Second().Token} {
					if strings.Contains(h, tok) {
						t.Fatalf("a token is kept as it is: %q", h)
					}
				}
				if len(h) != 64 {
					t.Fatalf("kept %q, want a SHA-256 in hex", h)
				}
			}
		})
	}
}

// TestJoinWithoutCode: a lab with no join code takes anyone, up to its
// limit; a limit of 0 takes no one; storage that is down refuses the join
// with the reason.
func TestJoinWithoutCode(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, err := tenants.NewDirectory(nil, tenants.NewInMemory(), "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Join(ctx, "anything"); err != nil {
		t.Fatalf("joining a lab without a code: %v", err)
	}
	if _, err := d.Join(ctx, ""); !errors.Is(err, tenants.ErrJoinClosed) {
		t.Fatalf("beyond the limit: %v", err)
	}
	closed, err := tenants.NewDirectory(nil, tenants.NewInMemory(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := closed.Join(ctx, ""); !errors.Is(err, tenants.ErrJoinClosed) {
		t.Fatalf("a lab taking no attendees: %v", err)
	}
	down, err := tenants.NewDirectory(nil, failing{tenants.NewInMemory()}, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := down.Join(ctx, ""); err == nil || errors.Is(err, tenants.ErrJoinClosed) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("storage down: %v, want its error, not a closed lab", err)
	}
}
