package attack_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/lab/provider"
)

// The HTTP fuzz run: thousands of bad requests, each a good request with
// noise (extra or duplicate headers, unknown parameters) and one mutation
// that must make the lab refuse it, sent over real HTTP by concurrent
// workers at a lab with real PostgreSQL and Redis. Nothing may answer 5xx,
// every refusal is problem+json with a code, and neither the ledger nor any
// store may change.

const (
	fuzzAdmin    = "fuzz-admin-token"
	fuzzJoinCode = "fuzz-join-code"
	fuzzRequests = 5000
	fuzzWorkers  = 8
	fuzzSeed     = 0x1de4
)

// fuzzReq is one generated request.
type fuzzReq struct {
	bad     string // the mutation that makes it bad
	method  string
	path    string   // sent as is
	query   []string // raw name=value pairs, joined with &
	header  http.Header
	body    []byte
	chunked bool // sent with Transfer-Encoding: chunked
}

func (f fuzzReq) target() string {
	if len(f.query) == 0 {
		return f.path
	}
	return f.path + "?" + strings.Join(f.query, "&")
}

func (f fuzzReq) String() string {
	return fmt.Sprintf("[%s] %s %.200q headers %.300q body %.200q", f.bad, f.method, f.target(), fmt.Sprint(f.header), f.body)
}

// fuzzGen generates requests from one seeded source: the same seed, the
// same requests.
type fuzzGen struct {
	rng            *rand.Rand
	tokens         []string // tenants' tokens
	admin, joinKey string
}

func (g *fuzzGen) pick(xs ...string) string { return xs[g.rng.IntN(len(xs))] }
func (g *fuzzGen) chance(p float64) bool    { return g.rng.Float64() < p }
func (g *fuzzGen) token() string            { return g.tokens[g.rng.IntN(len(g.tokens))] }

// fuzzMutation makes a request bad and says how.
type fuzzMutation func(g *fuzzGen, r *fuzzReq) string

func (g *fuzzGen) next(i int) fuzzReq {
	r := fuzzReq{header: http.Header{}}
	var fatal []fuzzMutation
	switch n := g.rng.IntN(100); {
	case n < 40:
		fatal = g.charge(&r, i)
	case n < 52:
		fatal = g.run(&r, i)
	case n < 60:
		fatal = g.state(&r)
	case n < 65:
		fatal = g.outbox(&r)
	case n < 69:
		fatal = g.summary(&r)
	case n < 75:
		fatal = g.reset(&r)
	case n < 81:
		fatal = g.restart(&r)
	case n < 86:
		fatal = g.join(&r)
	case n < 90:
		fatal = g.matrix(&r)
	case n < 94:
		fatal = g.static(&r)
	default:
		fatal = g.unknown(&r)
	}
	for range g.rng.IntN(3) {
		g.noise(&r)
	}
	r.bad = fatal[g.rng.IntN(len(fatal))](g, &r)
	if g.chance(0.1) { // a second defect now and then
		r.bad += " + " + fatal[g.rng.IntN(len(fatal))](g, &r)
	}
	return r
}

// noise changes what must not matter: unknown parameters, extra headers,
// content types, a second Authorization line after the first.
func (g *fuzzGen) noise(r *fuzzReq) {
	switch g.rng.IntN(8) {
	case 0:
		r.query = append(r.query, g.pick("foo", "x", "debug", "utm_source", "token", "admin", "callback", "_")+"="+
			g.pick("1", "", "%ff", "a%00b", "%E2%82%AC", strings.Repeat("n", 500), g.admin))
	case 1:
		r.header.Set(g.pick("X-Forwarded-For", "X-Real-Ip", "Forwarded", "X-Tenant", "X-Namespace"), g.pick("1.2.3.4", "globex", "acme", "\xff"))
	case 2:
		r.header.Set("Content-Type", g.pick("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
			"application/json; charset=latin1", "", "application/problem+json"))
	case 3:
		r.header.Set("Accept", g.pick("text/html", "*/*", "application/xml", "\xff"))
	case 4:
		r.header.Set("User-Agent", g.pick("sqlmap/1.7", "curl/8", "\xff\xfe", strings.Repeat("u", 2000)))
	case 5:
		r.header.Set("Lab-Run", g.pick("run-1", "fuzz", "r"))
	case 6:
		r.header.Set(lab.FaultHeader, g.pick("slow; work_ms=5", "outbox_fail", "slow; work_ms=1; ttl_ms=10"))
	case 7:
		if r.header.Get("Authorization") != "" {
			r.header.Add("Authorization", "Bearer "+g.token())
		}
	}
}

// Bad values, by the kind of parameter.

func (g *fuzzGen) badInt(over string) string {
	return g.pick("", "0", "-1", "01", "+1", "1.0", "1e1", "%201", "1%20", "0x10", "1_0", "%00", "%ff", "-0", "abc",
		"99999999999999999999", "1%0A", "%EF%BC%91", strings.Repeat("9", 3000), over)
}

func (g *fuzzGen) badText(max int) string {
	return g.pick("", "%00", "%ff", "a%0Ab", "%7F", "a%C2%85", "%ed%a0%80", "%c0%af", "\xff\xfe", "a%09b",
		"%E2%80%8B", "k%E2%80%AEk", "k%C2%A0", "+++", "%E3%80%80", "%EF%BB%BFk", "%E3%85%A4",
		strings.Repeat("x", max+1), strings.Repeat("%E2%82%AC", max/3+1), strings.Repeat("y", 5000))
}

func (g *fuzzGen) badName() string {
	return g.pick("", "%00", "%ff", "Memory", "MEMORY", "memory%20", "nope", "1memory", "memory!", "memory%00",
		strings.Repeat("a", 33), "-x", "\xff", "mem%2Fory", "none%0A")
}

func (g *fuzzGen) badChoice() string {
	return g.pick("", "yes", "1", "TRUE", "True", "%00", "truee", "false%00", "\xff", "t")
}

func (g *fuzzGen) malformedQuery(r *fuzzReq) string {
	r.query = append(r.query, g.pick("%zz", "%", "%f", "a=%zz", "a;b", "x=1;y=2", "%g0=1", "key=%"))
	return "malformed query"
}

// repeat gives one of the request's parameters twice.
func (g *fuzzGen) repeat(r *fuzzReq, names ...string) string {
	name := g.pick(names...)
	r.query = append(r.query, name+"=1", name+"=1")
	return "repeated " + name
}

// badAuth replaces Authorization with something that names no one (missing
// only where a token is required).
func (g *fuzzGen) badAuth(r *fuzzReq, missingIsBad bool) string {
	tok := g.token()
	vals := []string{"Bearer nope", "Bearer " + tok + "x", "Bearer  " + tok, "Bearer\t" + tok, tok, "Token " + tok,
		"Basic " + base64.StdEncoding.EncodeToString([]byte("acme:"+tok)), "Bearer", "Bearer ", "Bearer \xff\xfe",
		"Bearer " + strings.Repeat("t", 5000), "Bearer " + strings.ToUpper(tok), g.admin}
	if missingIsBad {
		vals = append(vals, "", "Bearer "+g.admin)
	}
	v := vals[g.rng.IntN(len(vals))]
	r.header.Del("Authorization")
	if v != "" {
		r.header.Set("Authorization", v)
		if g.chance(0.2) {
			r.header.Add("Authorization", "Bearer "+tok) // a good second line does not save a bad first one
		}
	}
	return fmt.Sprintf("authorization %.40q", v)
}

func (g *fuzzGen) wrongMethod(r *fuzzReq, methods ...string) string {
	r.method = g.pick(methods...)
	return "method " + r.method
}

func (g *fuzzGen) validBody() []byte {
	fields := []string{fmt.Sprintf(`"account":"acct-%d"`, g.rng.IntN(5)), fmt.Sprintf(`"amount_cents":%d`, 1+g.rng.IntN(10_000))}
	if g.chance(0.5) {
		fields = append(fields, `"currency":"`+g.pick("USD", "eur", "GBP")+`"`)
	}
	if g.chance(0.3) {
		fields = append(fields, fmt.Sprintf(`"order_id":"o-%d"`, g.rng.IntN(100)))
	}
	g.rng.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	return []byte("{" + strings.Join(fields, ",") + "}")
}

// badBody is a charge body the parser must refuse.
func (g *fuzzGen) badBody() (string, []byte) {
	ok := g.validBody()
	acct := func(v string) []byte { return []byte(`{"account":` + v + `,"amount_cents":2500}`) }
	amount := func(v string) []byte { return []byte(`{"account":"acct-1","amount_cents":` + v + `}`) }
	with := func(field, v string) []byte {
		return []byte(`{"account":"acct-1","amount_cents":2500,"` + field + `":` + v + `}`)
	}
	switch g.rng.IntN(13) {
	case 0:
		return "truncated", ok[:g.rng.IntN(len(ok)-1)]
	case 1:
		return "trailing data", append(ok, g.pick("]", "}", " x", "null", "0", "{}", ",", `"`, string(ok), "\x00", "\n]")...)
	case 2:
		f := g.pick(`"account":"acct-9"`, `"amount_cents":1`, `"currency":"USD"`, `"order_id":"o-1"`, `"amount\u005fcents":7`)
		return "duplicate key", append(append([]byte(`{`+f+`,`), ok[1:len(ok)-1]...), []byte(`,`+f+`}`)...)
	case 3:
		return "amount not a JSON integer", amount(g.pick(`"2500"`, `2500.0`, `2.5e3`, `25E2`, `-0`, `1e1000`, `true`, `[2500]`,
			`{"v":2500}`, `null`, `02500`, `99999999999999999999`, `-5`, `0`, `10000001`, `0x9c4`, `+2500`, `.5`, strings.Repeat("9", 5000)))
	case 4:
		return "account", acct(g.pick(`null`, `""`, `1`, `[]`, `{}`, `"`+strings.Repeat("a", 65)+`"`, `"a\u0001b"`, `"a\u0085b"`, `true`,
			`"\u200b"`, `"acct\u2066-1"`, `"   "`, `"acct-1\u00a0"`, "\"acct\u202e-1\""))
	case 5:
		if g.chance(0.5) {
			return "currency", with("currency", g.pick(`null`, `""`, `1`, `"US"`, `"USDD"`, `"1$%"`, `"U\u0000D"`, `[]`, `{}`))
		}
		return "order_id", with("order_id", g.pick(`null`, `""`, `1`, `"`+strings.Repeat("o", 65)+`"`, `"a\u0001b"`, `[]`, `true`, `"\ufeffo"`, `" o-1"`))
	case 6:
		bad := g.pick("\xff", "\xc3\x28", "\xc0\xaf", "\xed\xa0\x80", "\xe2\x82", "\xf4\x90\x80\x80", "\xfe")
		return "invalid UTF-8", []byte(`{"account":"acct-` + bad + `","amount_cents":2500}`)
	case 7:
		return "unknown field", with(g.pick("tip", "tenant", "Account", "AMOUNT_CENTS", "idempotency_key", "", "amount_cents "), "1")
	case 8:
		return "missing field", []byte(g.pick(`{"amount_cents":2500}`, `{"account":"acct-1"}`, `{}`, `{"currency":"USD"}`))
	case 9:
		return "not an object", []byte(g.pick(`[`+string(ok)+`]`, `"`+string(ok)+`"`, `2500`, `null`, ``, ` `, `{`, `}`, `true`, "\x00"))
	case 10:
		return "escapes", acct(g.pick(`"acct-\ud800"`, `"acct-\udc00x"`, `"\ud83d"`, `"acct-\x"`, `"acct-\u12"`))
	case 11:
		return "byte order mark", append([]byte("\xef\xbb\xbf"), ok...)
	default:
		return "nested", acct(strings.Repeat("[", 5000) + strings.Repeat("]", 5000))
	}
}

// badKey is an Idempotency-Key field the server must refuse.
func (g *fuzzGen) badKey(r *fuzzReq, i int) string {
	if g.chance(0.2) {
		r.header[lab.KeyHeader] = []string{fmt.Sprintf("fz-%d", i), fmt.Sprintf("fz-%d-b", i)}
		return "two Idempotency-Key fields"
	}
	v := g.pick("", "  ", `"unterminated`, `a\b`, `a"b`, `"a\x"`, `"ü"`, `"a" b`, `""`, "a\tb", "\xff\xfe",
		"\u200b", "a\u202eb", "k\u00a0", "\u3000", "\ufeffk", "k\u00adk", "\u3164",
		strings.Repeat("k", 256), strings.Repeat("k", 5000), `"`+strings.Repeat("q", 256)+`"`)
	r.header[lab.KeyHeader] = []string{v}
	return fmt.Sprintf("Idempotency-Key %.30q", v)
}

func (g *fuzzGen) charge(r *fuzzReq, i int) []fuzzMutation {
	store := g.pick("memory", "redis", "postgres", "unsafe", "")
	r.method, r.path = http.MethodPost, "/charges"
	if store != "" {
		r.query = []string{"store=" + store}
	}
	r.header.Set("Authorization", "Bearer "+g.token())
	r.header.Set(lab.KeyHeader, fmt.Sprintf("fz-%d", i))
	r.header.Set("Content-Type", "application/json")
	r.body = g.validBody()
	return []fuzzMutation{
		func(g *fuzzGen, r *fuzzReq) string { return g.badAuth(r, true) },
		func(g *fuzzGen, r *fuzzReq) string {
			if store != "unsafe" && g.chance(0.3) { // only a store that needs a key misses it
				r.header.Del(lab.KeyHeader)
				return "Idempotency-Key missing"
			}
			return g.badKey(r, i)
		},
		func(g *fuzzGen, r *fuzzReq) string {
			v := g.pick("meteor", "slow", "slow; work_ms=0", "slow; work_ms=10001", "slow; work_ms=60001", "slow; work_ms=abc",
				"slow; work_ms=01", "crash_after_claim; crash_after_claim", "slow; work_ms=5; work_ms=5", "x=1", ";=;", "\xff",
				"slow; work_ms=-1", "slow;work_ms=1e3", "none", "CRASH_AFTER_CLAIM", "slow; ttl_ms=0; work_ms=1", strings.Repeat("slow;", 2000))
			r.header[lab.FaultHeader] = []string{v}
			if g.chance(0.2) {
				r.header.Add(lab.FaultHeader, "slow; work_ms=1")
			}
			return fmt.Sprintf("Lab-Fault %.30q", v)
		},
		func(g *fuzzGen, r *fuzzReq) string {
			r.header.Set("Lab-Run", g.pick(strings.Repeat("r", 65), "a\tb", "\xff", strings.Repeat("r", 5000), "run-\u202e1", "\u200b"))
			return "Lab-Run"
		},
		func(g *fuzzGen, r *fuzzReq) string {
			what, body := g.badBody()
			r.body = body
			return "body: " + what
		},
		func(g *fuzzGen, r *fuzzReq) string {
			if g.chance(0.3) {
				return g.repeat(r, "store")
			}
			r.query = append(slices.DeleteFunc(r.query, func(p string) bool { return strings.HasPrefix(p, "store=") }), "store="+g.badName())
			return "bad store"
		},
		func(g *fuzzGen, r *fuzzReq) string { return g.malformedQuery(r) },
		func(g *fuzzGen, r *fuzzReq) string {
			return g.wrongMethod(r, http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodPatch, "TRACE")
		},
		func(g *fuzzGen, r *fuzzReq) string { r.chunked = true; return "chunked body" },
		func(g *fuzzGen, r *fuzzReq) string {
			r.body = append(bytes.Repeat([]byte(" "), 64<<10+g.rng.IntN(40_000)), r.body...) // valid JSON, too large
			return "body over 64 KiB"
		},
	}
}

func (g *fuzzGen) run(r *fuzzReq, i int) []fuzzMutation {
	idem := g.chance(0.6)
	r.method, r.path = g.pick(http.MethodGet, http.MethodPost), "/charge-unsafe"
	if idem {
		r.path = "/charge-idempotent"
		if g.chance(0.8) {
			r.query = append(r.query, "store="+g.pick("memory", "redis", "postgres"))
		}
	}
	r.query = append(r.query, fmt.Sprintf("key=fz-run-%d", i), fmt.Sprintf("attempts=%d", 1+g.rng.IntN(3)))
	if g.chance(0.5) {
		r.header.Set("Authorization", "Bearer "+g.token())
	}
	return []fuzzMutation{
		func(g *fuzzGen, r *fuzzReq) string {
			type param struct{ name, value string }
			ps := []param{
				{"attempts", g.badInt("65")}, {"amount", g.badInt("10000001")}, {"replicas", g.badInt("9")},
				{"key", g.badText(lab.MaxKeyBytes)}, {"account", g.badText(lab.MaxAccountBytes)}, {"order_id", g.badText(lab.MaxOrderIDBytes)},
				{"scenario", g.badName()}, {"fault", g.badName()}, {"ttl_ms", g.badInt("60001")},
				{"tenant", g.pick("globex", "acme", "", "%00")}, {"other_tenant", g.pick("globex", "acme~2", "")},
				{"fault=slow&work_ms", g.badInt("10001")}, {"fault=expired&window_ms", g.badInt("60001")},
			}
			if idem {
				ps = append(ps, param{"store", g.pick("unsafe", g.badName())})
			}
			p := ps[g.rng.IntN(len(ps))]
			name := p.name[strings.LastIndexByte(p.name, '&')+1:]
			r.query = append(slices.DeleteFunc(r.query, func(q string) bool { return strings.HasPrefix(q, name+"=") }), p.name+"="+p.value)
			return fmt.Sprintf("%s=%.30q", p.name, p.value)
		},
		func(g *fuzzGen, r *fuzzReq) string { return g.repeat(r, "attempts", "key", "amount", "account") },
		func(g *fuzzGen, r *fuzzReq) string { return g.malformedQuery(r) },
		func(g *fuzzGen, r *fuzzReq) string { return g.badAuth(r, false) },
		func(g *fuzzGen, r *fuzzReq) string {
			return g.wrongMethod(r, http.MethodPut, http.MethodDelete, http.MethodPatch, "TRACE")
		},
	}
}

func (g *fuzzGen) state(r *fuzzReq) []fuzzMutation {
	r.method, r.path, r.query = http.MethodGet, "/idempotency/state", []string{"limit=20"}
	if g.chance(0.5) {
		r.header.Set("Authorization", "Bearer "+g.token())
	}
	return []fuzzMutation{
		func(g *fuzzGen, r *fuzzReq) string {
			r.query = []string{"limit=" + g.badInt("201")}
			return "limit"
		},
		func(g *fuzzGen, r *fuzzReq) string { r.query = append(r.query, "store="+g.badName()); return "store" },
		func(g *fuzzGen, r *fuzzReq) string {
			r.query = append(r.query, "store="+g.pick("memory", "redis", "postgres"), "key="+g.badText(lab.MaxKeyBytes))
			return "key"
		},
		func(g *fuzzGen, r *fuzzReq) string { r.query = append(r.query, "key=fz-1"); return "key without store" },
		func(g *fuzzGen, r *fuzzReq) string {
			r.query = append(r.query, "account="+g.badText(lab.MaxAccountBytes))
			return "account"
		},
		func(g *fuzzGen, r *fuzzReq) string { return g.repeat(r, "limit", "store", "account") },
		func(g *fuzzGen, r *fuzzReq) string { return g.malformedQuery(r) },
		func(g *fuzzGen, r *fuzzReq) string { return g.badAuth(r, false) },
		func(g *fuzzGen, r *fuzzReq) string {
			return g.wrongMethod(r, http.MethodPost, http.MethodPut, http.MethodDelete)
		},
	}
}

func (g *fuzzGen) outbox(r *fuzzReq) []fuzzMutation {
	r.method, r.path, r.query = http.MethodGet, "/outbox", []string{"limit=20"}
	return []fuzzMutation{
		func(g *fuzzGen, r *fuzzReq) string { r.query = []string{"limit=" + g.badInt("201")}; return "limit" },
		func(g *fuzzGen, r *fuzzReq) string { return g.repeat(r, "limit") },
		func(g *fuzzGen, r *fuzzReq) string { return g.malformedQuery(r) },
		func(g *fuzzGen, r *fuzzReq) string { return g.badAuth(r, false) },
		func(g *fuzzGen, r *fuzzReq) string { return g.wrongMethod(r, http.MethodPost, http.MethodDelete) },
	}
}

func (g *fuzzGen) summary(r *fuzzReq) []fuzzMutation {
	r.method, r.path = http.MethodGet, "/diagnostics/summary"
	return []fuzzMutation{
		func(g *fuzzGen, r *fuzzReq) string { return g.badAuth(r, false) },
		func(g *fuzzGen, r *fuzzReq) string {
			return g.wrongMethod(r, http.MethodPost, http.MethodPut, http.MethodDelete)
		},
	}
}

func (g *fuzzGen) reset(r *fuzzReq) []fuzzMutation {
	r.method, r.path = g.pick(http.MethodPost, http.MethodGet), "/reset-lab"
	if g.chance(0.5) {
		r.header.Set("Authorization", "Bearer "+g.token())
	}
	return []fuzzMutation{
		func(g *fuzzGen, r *fuzzReq) string { return g.badAuth(r, false) },
		func(g *fuzzGen, r *fuzzReq) string {
			r.query = append(r.query, "all=true")
			return "all=true without the admin"
		},
		func(g *fuzzGen, r *fuzzReq) string { r.query = append(r.query, "all="+g.badChoice()); return "all" },
		func(g *fuzzGen, r *fuzzReq) string { r.query = append(r.query, "local="+g.badChoice()); return "local" },
		func(g *fuzzGen, r *fuzzReq) string { return g.repeat(r, "all", "local") },
		func(g *fuzzGen, r *fuzzReq) string { return g.malformedQuery(r) },
		func(g *fuzzGen, r *fuzzReq) string {
			return g.wrongMethod(r, http.MethodPut, http.MethodDelete, http.MethodPatch)
		},
	}
}

func (g *fuzzGen) restart(r *fuzzReq) []fuzzMutation {
	r.method, r.path = http.MethodPost, "/lab/restart-store"
	r.query = []string{"store=" + g.pick("memory", "redis", "postgres", "unsafe")}
	if g.chance(0.5) {
		r.header.Set("Authorization", "Bearer "+g.token())
	}
	return []fuzzMutation{
		func(g *fuzzGen, r *fuzzReq) string { r.query = []string{"store=" + g.badName()}; return "store" },
		func(g *fuzzGen, r *fuzzReq) string { return g.repeat(r, "store", "all") },
		func(g *fuzzGen, r *fuzzReq) string {
			r.query = append(r.query, "all=true")
			return "all=true without the admin"
		},
		func(g *fuzzGen, r *fuzzReq) string { r.query = append(r.query, "all="+g.badChoice()); return "all" },
		func(g *fuzzGen, r *fuzzReq) string { return g.malformedQuery(r) },
		func(g *fuzzGen, r *fuzzReq) string { return g.badAuth(r, false) },
		func(g *fuzzGen, r *fuzzReq) string { return g.wrongMethod(r, http.MethodGet, http.MethodPut) },
	}
}

func (g *fuzzGen) join(r *fuzzReq) []fuzzMutation {
	r.method, r.path = http.MethodPost, "/lab/join"
	r.header.Set("Content-Type", "application/json")
	code := strconv.Quote(g.joinKey)
	return []fuzzMutation{
		func(g *fuzzGen, r *fuzzReq) string {
			r.body = []byte(g.pick(``, `{}`, `{"code":"guess"}`, `{"code":null}`, `{"code":""}`, `{"code":"`+g.joinKey+`x"}`,
				`{"code":"`+strings.ToUpper(g.joinKey)+`"}`, `{"code":"`+g.joinKey+"\xff"+`"}`))
			return "wrong join code"
		},
		func(g *fuzzGen, r *fuzzReq) string {
			r.body = []byte(g.pick(`{"code":`, `[`+code+`]`, code, `{"code":1}`, `{"code":`+code+`,"tenant":"acme"}`, "\xff"))
			return "malformed join body"
		},
		// The strict-input rule holds for every body: one object, nothing
		// after it, each key once; the right code does not excuse it.
		func(g *fuzzGen, r *fuzzReq) string {
			r.body = []byte(g.pick(`{"code":`+code+`}]`, `{"code":`+code+`} x`, `{"code":`+code+`}{"code":"x"}`,
				`{"code":"x","code":`+code+`}`, `{"code":`+code+`,"code":`+code+`}`))
			return "join body with trailing data or a duplicate key"
		},
		func(g *fuzzGen, r *fuzzReq) string {
			r.body = []byte(`{"code":` + code + `}`)
			r.chunked = true
			return "chunked join"
		},
		func(g *fuzzGen, r *fuzzReq) string {
			return g.wrongMethod(r, http.MethodGet, http.MethodPut, http.MethodDelete)
		},
	}
}

func (g *fuzzGen) matrix(r *fuzzReq) []fuzzMutation {
	r.method, r.path = http.MethodGet, "/lab/matrix"
	return []fuzzMutation{
		func(g *fuzzGen, r *fuzzReq) string {
			r.query = []string{"format=" + g.pick("", "xml", "JSON", "%00", "csv", "\xff", "markdown%00")}
			return "format"
		},
		func(g *fuzzGen, r *fuzzReq) string { return g.repeat(r, "format") },
		func(g *fuzzGen, r *fuzzReq) string { return g.malformedQuery(r) },
		func(g *fuzzGen, r *fuzzReq) string { return g.badAuth(r, false) },
		func(g *fuzzGen, r *fuzzReq) string { return g.wrongMethod(r, http.MethodPost, http.MethodPut) },
	}
}

func (g *fuzzGen) static(r *fuzzReq) []fuzzMutation {
	r.method, r.path = http.MethodGet, g.pick("/health", "/ready", "/metrics", "/")
	return []fuzzMutation{
		func(g *fuzzGen, r *fuzzReq) string {
			return g.wrongMethod(r, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch)
		},
	}
}

func (g *fuzzGen) unknown(r *fuzzReq) []fuzzMutation {
	return []fuzzMutation{func(g *fuzzGen, r *fuzzReq) string {
		r.method = g.pick(http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete)
		r.path = g.pick("/chargez", "/charges/", "/charges/1", "/lab", "/lab/", "/lab/joins", "/admin", "/idempotency",
			"/idempotency/state/x", "/.env", "/%ff", "/charges%00", "/../etc/passwd", "/health/", "/reset-lab/all",
			"/lab/restart-store/memory", "/diagnostics", "/metrics/x", "/"+strings.Repeat("p", 3000))
		return "unknown route"
	}}
}

// fuzzAnswer is what came back.
type fuzzAnswer struct {
	status int
	ctype  string
	body   []byte
	err    error
}

func (f fuzzReq) send(client *http.Client, base string) fuzzAnswer {
	var body io.Reader = bytes.NewReader(f.body)
	if f.chunked {
		body = io.MultiReader(bytes.NewReader(f.body)) // no length known: sent chunked
	}
	req, err := http.NewRequest(f.method, base, body)
	if err != nil {
		return fuzzAnswer{err: err}
	}
	req.URL.Opaque = f.path // the path and query as generated, escapes and all
	req.URL.RawQuery = strings.Join(f.query, "&")
	req.Header = f.header.Clone()
	if f.chunked {
		req.ContentLength = -1
	}
	resp, err := client.Do(req)
	if err != nil {
		return fuzzAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return fuzzAnswer{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), body: b, err: err}
}

func TestHTTPFuzz(t *testing.T) {
	t.Parallel()
	cfg := e2e.FullConfig(t)
	cfg.AdminToken, cfg.JoinCode = fuzzAdmin, fuzzJoinCode
	a := labtest.Start(t, cfg)
	base := a.URL()
	ctx := context.Background()
	A, B := joinLab(t, base, fuzzJoinCode), joinLab(t, base, fuzzJoinCode)
	namespaces := []lab.Namespace{"", "acme", "globex", A.Namespace, B.Namespace}
	for _, ns := range namespaces {
		if l := ledgerOf(t, a, ns); len(l) != 0 {
			t.Fatalf("ledger of %q before the run: %+v", ns, l)
		}
	}

	g := &fuzzGen{rng: rand.New(rand.NewPCG(fuzzSeed, fuzzSeed)), tokens: []string{labtest.Acme, labtest.Globex, A.Token, B.Token},
		admin: fuzzAdmin, joinKey: fuzzJoinCode}
	reqs := make([]fuzzReq, fuzzRequests)
	for i := range reqs {
		reqs[i] = g.next(i)
	}
	answers := make([]fuzzAnswer, len(reqs))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: fuzzWorkers}, Timeout: 30 * time.Second}
	start := time.Now()
	jobs := make(chan int)
	var workers sync.WaitGroup
	for range fuzzWorkers {
		workers.Go(func() {
			for i := range jobs {
				answers[i] = reqs[i].send(client, base)
			}
		})
	}
	for i := range reqs {
		jobs <- i
	}
	close(jobs)
	workers.Wait()
	took := time.Since(start)
	client.CloseIdleConnections()

	byStatus := map[int]int{}
	failures := map[string][]string{}        // by kind, examples
	failedHow := map[string]map[string]int{} // by kind, by mutation
	fail := func(kind string, i int, a fuzzAnswer) {
		failures[kind] = append(failures[kind], fmt.Sprintf("%v\n      -> %d %s %v %.300s", reqs[i], a.status, a.ctype, a.err, a.body))
		if failedHow[kind] == nil {
			failedHow[kind] = map[string]int{}
		}
		failedHow[kind][reqs[i].bad]++
	}
	for i, ans := range answers {
		byStatus[ans.status]++
		switch {
		case ans.err != nil:
			fail("no answer", i, ans)
		case ans.status >= 500:
			fail("5xx", i, ans)
		case ans.status < 400:
			fail("a bad request accepted", i, ans)
		case ans.ctype != "application/problem+json":
			fail("an error that is not problem+json", i, ans)
		default:
			var p lab.Problem
			if err := json.Unmarshal(ans.body, &p); err != nil || p.Code == "" || p.Status != ans.status {
				fail("a problem without its code", i, ans)
			}
		}
	}
	t.Logf("sent %d bad requests with %d workers in %v (seed %#x); answers by status: %v", len(reqs), fuzzWorkers, took.Round(time.Millisecond), fuzzSeed, byStatus)
	for kind, list := range failures {
		t.Errorf("%d request(s) got %s, by mutation %v; the first:\n    %s", len(list), kind, failedHow[kind], strings.Join(list[:min(3, len(list))], "\n    "))
	}

	// Nothing changed: no charge, no event, no receipt, no run, no key.
	for _, ns := range namespaces {
		if l := ledgerOf(t, a, ns); len(l) != 0 {
			t.Errorf("ledger of %q after the run: %+v", ns, l)
		}
	}
	if s, err := a.Books().OutboxStats(ctx, ""); err != nil || s.Pending+s.Delivered+s.Dead != 0 {
		t.Errorf("outbox after the run: %+v %v", s, err)
	}
	if got, err := a.Provider().Stats(ctx, provider.Filter{}); err != nil || got.CaptureRequests+got.ReceiptDeliveries != 0 {
		t.Errorf("provider after the run: %+v %v", got.Stats, err)
	}
	if sum := labtest.Get[nsSummary](t, base+"/diagnostics/summary", fuzzAdmin); len(sum.RecentRuns) != 0 {
		t.Errorf("%d run(s) were fired", len(sum.RecentRuns))
	}
	for store, s := range stateAs(t, base, fuzzAdmin).Stores {
		if s.Total != 0 || len(s.Keys) != 0 {
			t.Errorf("%s holds %d key(s): %+v", store, s.Total, s.Keys)
		}
	}
	var rows int
	if err := e2e.Pool(t, cfg.DatabaseURL).QueryRow(ctx, `SELECT count(*) FROM `+cfg.PGSchema+`.idempotency_requests`).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("idempotency_requests holds %d row(s) (%v)", rows, err)
	}
	opts, err := goredis.ParseURL(cfg.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	rc := goredis.NewClient(opts)
	defer rc.Close()
	var keys []string
	iter := rc.Scan(ctx, 0, cfg.RedisPrefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil || len(keys) != 0 {
		t.Errorf("Redis holds %d key(s) under the lab's prefix: %q (%v)", len(keys), keys[:min(5, len(keys))], err)
	}
}
