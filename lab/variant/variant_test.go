package variant_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/pgdb"
	"github.com/idempotency-lab/lab/lab/variant"
)

// toy is a well-formed keyed variant named name.
func toy(name lab.StoreName) variant.Variant {
	return variant.Variant{
		Name: name, Label: "a toy", RequiresKey: true, Effects: "outbox", Crash: variant.CrashWipesHeap,
		Open: func(context.Context, variant.Deps) (lab.Store, error) { return nil, nil },
		Mechanisms: map[variant.Case]variant.Mechanism{
			variant.CaseRetries:  {Usual: lab.Holds, Holds: "one claim wins", Breaks: "no claim won"},
			variant.CaseReplicas: {Usual: lab.Breaks, Holds: "shared", Breaks: "one map per replica"},
		},
	}
}

// keyless is a well-formed variant that ignores keys.
func keyless(name lab.StoreName) variant.Variant {
	return variant.Variant{Name: name, Effects: "direct", Crash: variant.CrashNothingToLose,
		Open: func(context.Context, variant.Deps) (lab.Store, error) { return nil, nil }}
}

// TestRegistryKeepsOrderAndFinds: the registry lists the variants in the
// order given (the lesson's), finds each by name, and nothing else.
func TestRegistryKeepsOrderAndFinds(t *testing.T) {
	t.Parallel()
	r, err := variant.NewRegistry(keyless("plain"), toy("zeta"), toy("alpha"), toy("one+two"))
	if err != nil {
		t.Fatal(err)
	}
	want := []lab.StoreName{"plain", "zeta", "alpha", "one+two"}
	if got := r.Names(); !slices.Equal(got, want) {
		t.Fatalf("names %v, want %v as registered", got, want)
	}
	all := r.All()
	for i, v := range all {
		if v.Name != want[i] {
			t.Fatalf("All()[%d] is %s, want %s", i, v.Name, want[i])
		}
		got, ok := r.Get(v.Name)
		if !ok || got.Name != v.Name || got.Label != v.Label {
			t.Fatalf("Get(%s) = %+v, %v", v.Name, got.Name, ok)
		}
	}
	all[0].Name = "changed" // the caller's copy, not the registry's
	if r.Names()[0] != "plain" {
		t.Fatal("changing All's answer changed the registry")
	}
	if _, ok := r.Get("Zeta"); ok {
		t.Fatal("names are matched case-insensitively")
	}
	if _, ok := r.Get("missing"); ok {
		t.Fatal("found a variant never registered")
	}
}

// TestRegistryMechanism finds a (variant, case)'s explanation, and says so
// when the variant gives none or is not there.
func TestRegistryMechanism(t *testing.T) {
	t.Parallel()
	r, err := variant.NewRegistry(toy("toy"), keyless("plain"))
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := r.Mechanism("toy", variant.CaseReplicas); !ok || m.Usual != lab.Breaks || m.Breaks != "one map per replica" {
		t.Fatalf("toy's replicas: %+v, %v", m, ok)
	}
	for _, c := range []struct {
		store lab.StoreName
		c     variant.Case
	}{{"toy", variant.CaseTenants}, {"plain", variant.CaseRetries}, {"missing", variant.CaseRetries}} {
		if m, ok := r.Mechanism(c.store, c.c); ok {
			t.Errorf("%s, %s: found %+v", c.store, c.c, m)
		}
	}
	if got := variant.FaultCase(lab.FaultCrashAfterClaim); got != "crash_after_claim" {
		t.Fatalf("the case of a fault point is %q, want its name", got)
	}
}

// TestMechanismExpected: the usual verdict is the declared one, unless the
// mechanism derives it from the run's faults.
func TestMechanismExpected(t *testing.T) {
	t.Parallel()
	fixed := variant.Mechanism{Usual: lab.Holds}
	if got := fixed.Expected(lab.Faults{Work: time.Hour}); got != lab.Holds {
		t.Fatalf("fixed: %s", got)
	}
	ttl := variant.Mechanism{Usual: lab.Holds, UsualWith: func(f lab.Faults) lab.Verdict {
		if f.Work > f.ClaimTTL {
			return lab.Breaks
		}
		return lab.Holds
	}}
	if got := ttl.Expected(lab.Faults{Work: 300 * time.Millisecond, ClaimTTL: 100 * time.Millisecond}); got != lab.Breaks {
		t.Fatalf("work past the TTL: %s, want breaks", got)
	}
	if got := ttl.Expected(lab.Faults{Work: 100 * time.Millisecond, ClaimTTL: time.Second}); got != lab.Holds {
		t.Fatalf("work within the TTL: %s, want holds", got)
	}
}

// TestRegistryRefusesBadVariants: names, effects, needs, crash effects and
// verdicts are checked once, when the lab starts, and every mistake is
// named at once.
func TestRegistryRefusesBadVariants(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		mutate func(*variant.Variant)
		says   string
	}{
		"duplicate name": {func(v *variant.Variant) { v.Name = "other" }, "registered twice"},
		"bad name":       {func(v *variant.Variant) { v.Name = "One Lock" }, "lower-case"},
		"long name":      {func(v *variant.Variant) { v.Name = lab.StoreName("a" + strings.Repeat("b", 32)) }, "at most 32"},
		"no open":        {func(v *variant.Variant) { v.Open = nil }, "Open is nil"},
		"bad effects":    {func(v *variant.Variant) { v.Effects = "carrier pigeon" }, "outbox or direct"},
		"unknown need":   {func(v *variant.Variant) { v.Needs = []variant.Need{"kafka"} }, `unknown need "kafka"`},
		"no crash":       {func(v *variant.Variant) { v.Crash = "" }, "declares what a crash leaves"},
		"keyless crash":  {func(v *variant.Variant) { v.RequiresKey = false }, "nothing a crash could leave"},
		"bad verdict": {func(v *variant.Variant) {
			v.Mechanisms = map[variant.Case]variant.Mechanism{variant.CaseRetries: {Usual: "maybe"}}
		}, "holds or breaks"},
	} {
		t.Run(name, func(t *testing.T) {
			v := toy("toy")
			c.mutate(&v)
			_, err := variant.NewRegistry(toy("other"), v)
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("NewRegistry: %v, want it to say %q", err, c.says)
			}
		})
	}
	if _, err := variant.NewRegistry(); err == nil || !strings.Contains(err.Error(), "no variants") {
		t.Fatalf("an empty registry: %v", err)
	}
	bad := toy("toy")
	bad.Open, bad.Needs = nil, []variant.Need{"kafka"}
	if _, err := variant.NewRegistry(bad, keyless("plain"), keyless("plain")); err == nil ||
		!strings.Contains(err.Error(), "Open is nil") || !strings.Contains(err.Error(), "kafka") || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("three mistakes: %v, want each named", err)
	}
	if _, err := variant.NewRegistry(toy("toy"), keyless("plain"), keyless("also-plain")); err != nil {
		t.Fatalf("refused good variants: %v", err)
	}
}

// TestDepsHas: a need is met by the service it names.
func TestDepsHas(t *testing.T) {
	t.Parallel()
	var none variant.Deps
	if none.Has(variant.NeedRedis) || none.Has(variant.NeedPostgres) || none.Has("kafka") {
		t.Fatal("empty deps meet a need")
	}
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	withRedis := variant.Deps{Redis: client}
	if !withRedis.Has(variant.NeedRedis) || withRedis.Has(variant.NeedPostgres) {
		t.Fatal("redis deps")
	}
	withPostgres := variant.Deps{Postgres: &pgdb.Pool{}}
	if !withPostgres.Has(variant.NeedPostgres) || withPostgres.Has(variant.NeedRedis) {
		t.Fatal("postgres deps")
	}
}
