package grade

import (
	"bytes"
	"context"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idempotency-lab/lab/lab/history"
)

// Case is one row of the check: what it asks of the target, where that is
// asked, and how strongly.
type Case struct {
	ID       string
	Title    string
	Source   string // the draft's section, or "lab"
	Severity Severity
	run      func(context.Context, *checker) (Verdict, string)
}

// blocking reports a case whose failure fails the check: the draft's
// MUSTs, and the storm, which is the lesson itself.
func (c Case) blocking() bool { return c.Severity == Must || c.ID == "storm" }

func draft(section string) string { return "draft-07 §" + section }

// Cases is the check's table, in the order it runs: the draft's cases,
// then the lesson's, then the history of everything sent.
func Cases() []Case {
	return []Case{
		{"missing-key", "a request without Idempotency-Key is refused with 400", draft("2.7"), Should, missingKey},
		{"sf-string", `the draft's form of the key, a Structured Field String ("…"), names one key: a retry with it replays`, draft("2.1"), Must, sfString},
		{"bare-key", "the bare form of a key (unquoted) names the same key as its quoted form", "lab", Lesson, bareKey},
		{"two-fields", "two Idempotency-Key fields in one request are refused, and nothing is created", draft("2.1"), Should, twoFields},
		{"reused-key", "the same key with another payload is refused with 422, and nothing is created", draft("2.7"), Should, reusedKey},
		{"in-flight", "a retry while the first request is in flight gets 409, waits for its answer, or gets 202 + Location resolving to the one resource", draft("2.7"), Should, inFlight},
		{"problem-json", "the idempotency errors (400, 409, 422) are application/problem+json", draft("2.7"), Should, problemJSON},
		{"storm", "concurrent retries released together create one resource, and every 2xx carries its id", "lab", Lesson, storm},
		{"replay-bytes", "a retry after completion gets the first answer byte for byte (status and body)", "lab", Lesson, replayBytes},
		{"replay-marked", "a replay is marked with the replay header, and a first answer is not", "lab", Lesson, replayMarked},
		{"field-order", "JSON field order and whitespace do not change the fingerprint: the reordered request replays", "lab", Lesson, fieldOrder},
		{"lost-response", "a request whose response was lost (the client closed the connection right after sending), then retried, makes one resource", "lab", Lesson, lostResponse},
		{"tenants", "two clients (tokens) using one key get two resources, and never see each other's", "lab", Lesson, tenants},
		{"retention", "after the declared retention a key is new", "lab", Lesson, retention},
		{"history", "the history of every request sent is linearizable against \"one resource per key\"", "lab", Lesson, checkHistory},
	}
}

func caseByID(id string) (Case, bool) {
	for _, c := range Cases() {
		if c.ID == id {
			return c, true
		}
	}
	return Case{}, false
}

func caseIDs() []string {
	var ids []string
	for _, c := range Cases() {
		ids = append(ids, c.ID)
	}
	return ids
}

// selected is the cases only names, in the table's order, the history
// always last; every case when only is empty.
func selected(only []string) []Case {
	var out []Case
	for _, c := range Cases() {
		if len(only) == 0 || slices.Contains(only, c.ID) || c.ID == "history" {
			out = append(out, c)
		}
	}
	return out
}

// preflight sends the first request of the check (the sf-string case's),
// and stops the check when the target does not answer it with a resource:
// a wrong token, body or id pointer would make every case fail for
// nothing. A busy target's 5xx is retried as a client would (follow).
func (ck *checker) preflight(ctx context.Context) error {
	key := ck.key("sf-string")
	r := ck.charge(key, ck.cfg.KeyForm, ck.body(ck.cfg.Body, key), false, 0)
	e := ck.follow(ctx, r, ck.send(ctx, r))
	switch {
	case e.err != nil:
		return fmt.Errorf("%w: %v", ErrPreflight, e.err)
	case e.status == http.StatusBadRequest && ck.cfg.KeyForm == SFString:
		return fmt.Errorf("%w with %s (the key as the draft's sf-string, %s): %s; if it takes bare keys only, try -key-form bare",
			ErrPreflight, e.told(), keyValue(key, SFString), excerpt(e.body))
	case !e.ok():
		return fmt.Errorf("%w with %s: %s (check -token, -body and -method)", ErrPreflight, e.told(), excerpt(e.body))
	case e.id == "":
		return fmt.Errorf("%w: its %d answer holds no id at %q (set -id to the JSON pointer of the resource id): %s",
			ErrPreflight, e.status, ck.cfg.IDPointer, excerpt(e.body))
	}
	ck.first = &e
	return nil
}

// excerpt is the start of a body, for a sentence.
func excerpt(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return fmt.Sprintf("%q", s)
}

func missingKey(ctx context.Context, ck *checker) (Verdict, string) {
	key := ck.key("missing-key")
	e := ck.send(ctx, ck.charge("", ck.cfg.KeyForm, ck.body(ck.cfg.Body, key), false, 0))
	switch {
	case e.status == http.StatusBadRequest:
		return Pass, "answered 400 to a request without the key"
	case e.ok():
		return Fail, fmt.Sprintf("answered %s without a key: a client that forgets the key is charged again on every retry", e.told())
	case e.status == 0:
		return Unverified, "no answer: " + e.told()
	}
	return Fail, fmt.Sprintf("answered %s; the draft asks 400 for a missing key", e.told())
}

func sfString(ctx context.Context, ck *checker) (Verdict, string) {
	key := ck.key("sf-string")
	first := ck.first
	if ck.cfg.KeyForm != SFString {
		key = ck.key("sf-string-quoted")
		e := ck.send(ctx, ck.charge(key, SFString, ck.body(ck.cfg.Body, key), false, 0))
		first = &e
	}
	if !first.ok() || first.id == "" {
		return Fail, fmt.Sprintf("the key %s was answered %s: the draft's own form of the key is refused", keyValue(key, SFString), first.told())
	}
	r := ck.charge(key, SFString, first.req.body, false, first.req.lane)
	retry := ck.settle(ctx, r)
	switch {
	case retry.ok() && retry.id == first.id:
		return Pass, fmt.Sprintf("%s made %s, and its retry was told the same", keyValue(key, SFString), first.id)
	case retry.ok():
		return Fail, fmt.Sprintf("%s made %s, and its retry made another, %s: the key did not hold", keyValue(key, SFString), first.id, retry.id)
	}
	return Fail, fmt.Sprintf("%s made %s, but its retry was answered %s", keyValue(key, SFString), first.id, retry.told())
}

func bareKey(ctx context.Context, ck *checker) (Verdict, string) {
	key := ck.key("bare-key")
	body := ck.body(ck.cfg.Body, key)
	lane := ck.lane()
	quoted := ck.settle(ctx, ck.charge(key, SFString, body, false, lane))
	if !quoted.ok() || quoted.id == "" {
		return Unverified, fmt.Sprintf("the quoted key was answered %s", quoted.told())
	}
	if again := ck.settle(ctx, ck.charge(key, SFString, body, false, lane)); again.id != quoted.id {
		return Unverified, fmt.Sprintf("the quoted key made %s and its retry %s: the key does not hold in one form, so two cannot be compared", quoted.id, again.told())
	}
	r := ck.charge(key, Bare, body, false, 0)
	r.key.Endpoint += " (bare key)" // a key of its own in the history: the draft does not say it is the same
	bare := ck.settle(ctx, r)
	switch {
	case bare.ok() && bare.id == quoted.id:
		return Pass, fmt.Sprintf("%s and %s were both told %s", keyValue(key, SFString), key, quoted.id)
	case bare.ok():
		return Fail, fmt.Sprintf("%s made %s and %s made %s: the quotes are taken as part of the key, so a client that quotes and one that does not are charged twice",
			keyValue(key, SFString), quoted.id, key, bare.id)
	case bare.status == http.StatusBadRequest:
		return NotApplicable, "the bare key was refused with 400: the target holds to the draft, whose key is a String (only the quoted form)"
	}
	return Fail, fmt.Sprintf("the bare key was answered %s", bare.told())
}

func twoFields(ctx context.Context, ck *checker) (Verdict, string) {
	key := ck.key("two-fields")
	r := ck.charge(key, ck.cfg.KeyForm, ck.body(ck.cfg.Body, key), false, 0)
	r.header["Idempotency-Key"] = []string{keyValue(key+"-a", ck.cfg.KeyForm), keyValue(key+"-b", ck.cfg.KeyForm)}
	r.record = false // which key would it be?
	e := ck.send(ctx, r)
	switch {
	case e.status == http.StatusBadRequest:
		return Pass, "answered 400 to two Idempotency-Key fields"
	case e.status >= 400 && e.status < 500:
		return Pass, fmt.Sprintf("refused two Idempotency-Key fields with %s (400 says it best: the field does not parse)", e.told())
	case e.ok():
		return Fail, fmt.Sprintf("answered %s to two keys at once: which one did it keep? A retry under either may charge again", e.told())
	case e.status == 0:
		return Unverified, "no answer: " + e.told()
	}
	return Fail, fmt.Sprintf("answered %s to two Idempotency-Key fields", e.told())
}

func reusedKey(ctx context.Context, ck *checker) (Verdict, string) {
	key := ck.key("reused-key")
	body := ck.body(ck.cfg.Body, key)
	other := []byte(nil)
	if ck.cfg.OtherBody != "" {
		other = ck.body(ck.cfg.OtherBody, key)
	} else {
		var err error
		if other, err = bumped(body); err != nil {
			return NotApplicable, err.Error()
		}
	}
	if fingerprint(other) == fingerprint(body) {
		return NotApplicable, "the other payload is the same request as the first (give another with -other-body)"
	}
	lane := ck.lane()
	first := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, body, false, lane))
	if !first.ok() || first.id == "" {
		return Unverified, "the first request was answered " + first.told()
	}
	e := ck.send(ctx, ck.charge(key, ck.cfg.KeyForm, other, false, lane))
	again := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, body, false, lane))
	ids, read, _ := ck.readBack(ctx, key, false)
	switch {
	case e.ok() && e.id != first.id:
		return Fail, fmt.Sprintf("the other payload under the key made another resource, %s (the first was %s)", e.id, first.id)
	case e.ok():
		return Fail, fmt.Sprintf("the other payload was answered %s, the first request's resource: it was replayed as if it were the same request, and the client never learns its request was not applied", e.told())
	case read && len(ids) != 1:
		return Fail, fmt.Sprintf("answered %s, but the read-back lists %d resources under the key", e.told(), len(ids))
	case e.status == http.StatusUnprocessableEntity && again.ok() && again.id == first.id:
		return Pass, "answered 422 to the other payload, and the first request still replays " + first.id
	case e.status == http.StatusUnprocessableEntity:
		return Fail, fmt.Sprintf("answered 422, but the first request's retry was then answered %s", again.told())
	case e.status == 0:
		return Unverified, "no answer to the other payload: " + e.told()
	}
	return Fail, fmt.Sprintf("answered %s to the other payload; the draft asks 422", e.told())
}

// inFlightGap is how long after the first request is sent its retry goes:
// long enough for the first to have been taken in, short enough to catch
// it working when it is slow.
const inFlightGap = 30 * time.Millisecond

func inFlight(ctx context.Context, ck *checker) (Verdict, string) {
	key := ck.key("in-flight")
	body := ck.body(ck.cfg.Body, key)
	a := ck.charge(key, ck.cfg.KeyForm, body, false, 0)
	for k, vs := range ck.cfg.SlowHeader {
		a.header[k] = append([]string(nil), vs...)
	}
	firstDone := make(chan exchange, 1)
	go func() { firstDone <- ck.send(ctx, a) }()
	sleep(ctx, inFlightGap)
	b := ck.send(ctx, ck.charge(key, ck.cfg.KeyForm, body, false, 0))
	first := <-firstDone
	defer ck.readBack(ctx, key, false) // for the history: what the key holds once both are done
	slow := ""
	if len(ck.cfg.SlowHeader) == 0 {
		slow = "; give a header or body field that makes the target slow with -slow-header"
	}
	switch {
	case !first.ok() && b.ok() && (first.status == http.StatusConflict || first.status == http.StatusAccepted):
		return Unverified, fmt.Sprintf("the retry, sent %.0f ms after the first request, was taken in before it (the retry was told %s, the first request %s): the two crossed on the way; run the check again",
			ms(b.call.Sub(first.call)), b.told(), first.told())
	case !first.ok() || first.id == "":
		return Unverified, fmt.Sprintf("the first request was answered %s%s", first.told(), slow)
	case !b.call.Before(first.ret):
		return Unverified, fmt.Sprintf("the first request was answered in %.0f ms, before its retry was sent: too fast to catch%s", ms(first.ret.Sub(first.call)), slow)
	}
	sent := fmt.Sprintf("sent %.0f ms into the first request", ms(b.call.Sub(first.call)))
	switch {
	case b.ok() && b.id == first.id:
		return Pass, fmt.Sprintf("the retry (%s) waited for the first and was told its resource, %s", sent, first.id)
	case b.ok():
		return Fail, fmt.Sprintf("the retry (%s) made another resource, %s (the first made %s): nothing held the key while the first was at work", sent, b.id, first.id)
	case b.status == http.StatusConflict:
		after := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, body, false, b.req.lane))
		if !after.ok() || after.id != first.id {
			return Fail, fmt.Sprintf("the retry (%s) got 409, but once the first was done a retry was answered %s", sent, after.told())
		}
		ra := ""
		if b.header.Get("Retry-After") == "" {
			ra = " (without Retry-After, it does not say when to retry)"
		}
		return Pass, fmt.Sprintf("the retry (%s) got 409%s; after the first it was told %s", sent, ra, first.id)
	case b.status == http.StatusAccepted && b.location == "":
		return Fail, fmt.Sprintf("the retry (%s) got 202 without a Location to follow", sent)
	case b.status == http.StatusAccepted:
		p := ck.follow(ctx, b.req, b)
		switch {
		case p.ok() && p.id == first.id:
			return Pass, fmt.Sprintf("the retry (%s) got 202, and its Location resolved to %s", sent, first.id)
		case p.ok():
			return Fail, fmt.Sprintf("the retry (%s) got 202, and its operation resolved to %s, not the first's %s", sent, p.id, first.id)
		}
		return Unverified, fmt.Sprintf("the retry (%s) got 202, but its Location never resolved to a resource (%s; the operation's id is read at %s)", sent, p.told(), ck.cfg.OperationID)
	case (b.status == http.StatusServiceUnavailable || b.status == http.StatusTooManyRequests) && b.header.Get("Retry-After") != "":
		return Unverified, fmt.Sprintf("the retry (%s) was shed, answered %s with Retry-After: the target was too busy to show what it does while a request is in flight; run the check again", sent, b.told())
	}
	return Fail, fmt.Sprintf("the retry (%s) was answered %s", sent, b.told())
}

func problemJSON(_ context.Context, ck *checker) (Verdict, string) {
	ck.mu.Lock()
	errs := slices.Clone(ck.errors)
	ck.mu.Unlock()
	if len(errs) == 0 {
		return NotApplicable, "no idempotency error (400, 409, 422) was answered to look at"
	}
	var bad []string
	for _, e := range errs {
		mt, _, _ := mime.ParseMediaType(e.header.Get("Content-Type"))
		_, err := decode(e.body)
		switch {
		case mt != "application/problem+json":
			bad = append(bad, fmt.Sprintf("%d as %q", e.status, e.header.Get("Content-Type")))
		case err != nil:
			bad = append(bad, fmt.Sprintf("%d whose body is no JSON", e.status))
		}
	}
	slices.Sort(bad)
	bad = slices.Compact(bad)
	if len(bad) > 0 {
		return Fail, fmt.Sprintf("%d of %d error answers were not problem+json: %s", len(bad), len(errs), strings.Join(bad, ", "))
	}
	return Pass, fmt.Sprintf("all %d error answers were application/problem+json", len(errs))
}

func storm(ctx context.Context, ck *checker) (Verdict, string) {
	key := ck.key("storm")
	r := ck.charge(key, ck.cfg.KeyForm, ck.body(ck.cfg.Body, key), false, 0)
	out, err := ck.storm(ctx, ck.cfg.Storm, r)
	if err != nil {
		return Unverified, err.Error()
	}
	byID := map[string]int{}
	var ids []string
	statuses := map[int]int{}
	for _, e := range out {
		statuses[e.status]++
		if e.ok() && e.id != "" {
			if byID[e.id] == 0 {
				ids = append(ids, e.id)
			}
			byID[e.id]++
		}
	}
	final := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, r.body, false, 0))
	read, readOK, _ := ck.readBack(ctx, key, false)
	told := answers(statuses)
	switch {
	case len(ids) > 1:
		parts := make([]string, len(ids))
		for i, id := range ids {
			parts[i] = fmt.Sprintf("%d told %s", byID[id], id)
		}
		return Fail, fmt.Sprintf("%d concurrent retries made %d resources: %s", len(out), len(ids), strings.Join(parts, ", "))
	case readOK && len(read) > 1:
		return Fail, fmt.Sprintf("%d concurrent retries (%s) were all told one resource, but the read-back lists %d under the key: %s",
			len(out), told, len(read), strings.Join(read, ", "))
	case !final.ok() || final.id == "":
		return Fail, fmt.Sprintf("after %d concurrent retries (%s), a retry was answered %s", len(out), told, final.told())
	case len(ids) == 1 && final.id != ids[0]:
		return Fail, fmt.Sprintf("%d concurrent retries were told %s, and a retry after them %s", len(out), ids[0], final.id)
	case readOK && (len(read) != 1 || read[0] != final.id):
		return Fail, fmt.Sprintf("the retries were told %s, but the read-back lists %v", final.id, read)
	}
	check := ""
	if readOK {
		check = ", the one the read-back lists"
	}
	return Pass, fmt.Sprintf("%d concurrent retries (%s) made one resource, %s%s", len(out), told, final.id, check)
}

// answers counts statuses: "15×201, 1×409".
func answers(statuses map[int]int) string {
	var keys []int
	for s := range statuses {
		keys = append(keys, s)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, s := range keys {
		name := fmt.Sprint(s)
		if s == 0 {
			name = "no answer"
		}
		parts[i] = fmt.Sprintf("%d×%s", statuses[s], name)
	}
	return strings.Join(parts, ", ")
}

// replayPair is a first answer and the answer to its retry after it.
type replayPair struct{ first, retry exchange }

func (ck *checker) replayPair(ctx context.Context) replayPair {
	if ck.replay != nil {
		return *ck.replay
	}
	key := ck.key("replay")
	lane := ck.lane()
	first := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, ck.body(ck.cfg.Body, key), false, lane))
	retry := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, first.req.body, false, lane))
	ck.replay = &replayPair{first, retry}
	return *ck.replay
}

func replayBytes(ctx context.Context, ck *checker) (Verdict, string) {
	p := ck.replayPair(ctx)
	switch {
	case !p.first.ok():
		return Unverified, "the first request was answered " + p.first.told()
	case p.retry.status != p.first.status:
		return Fail, fmt.Sprintf("the first answer was %d and the replay %d: a client cannot tell a replay's outcome from another", p.first.status, p.retry.status)
	case !bytes.Equal(p.first.body, p.retry.body):
		at := 0
		for at < len(p.first.body) && at < len(p.retry.body) && p.first.body[at] == p.retry.body[at] {
			at++
		}
		return Fail, fmt.Sprintf("the replay's body differs from the first from byte %d on (%d and %d bytes): the answer is rebuilt, not stored", at, len(p.first.body), len(p.retry.body))
	}
	return Pass, fmt.Sprintf("the replay was the first answer, %d and %d bytes, byte for byte", p.first.status, len(p.first.body))
}

func replayMarked(ctx context.Context, ck *checker) (Verdict, string) {
	name := ck.cfg.ReplayHeader
	if name == "" {
		return NotApplicable, "no replay header named (-replay-header)"
	}
	p := ck.replayPair(ctx)
	switch {
	case !p.first.ok() || !p.retry.ok():
		return Unverified, fmt.Sprintf("the first request was answered %s and its retry %s", p.first.told(), p.retry.told())
	case p.first.replayed:
		return Fail, fmt.Sprintf("the first answer already carries %s: %s", name, p.first.header.Get(name))
	case p.retry.replayed:
		return Pass, fmt.Sprintf("the replay carries %s: %s, the first answer does not", name, p.retry.header.Get(name))
	}
	return NotApplicable, fmt.Sprintf("the replay carries no %s: the target marks no replay with it (name the header it uses with -replay-header)", name)
}

func fieldOrder(ctx context.Context, ck *checker) (Verdict, string) {
	key := ck.key("field-order")
	body := ck.body(ck.cfg.Body, key)
	other, err := reordered(body)
	if err != nil {
		return NotApplicable, err.Error()
	}
	lane := ck.lane()
	first := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, body, false, lane))
	if !first.ok() || first.id == "" {
		return Unverified, "the first request was answered " + first.told()
	}
	e := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, other, false, lane))
	ck.readBack(ctx, key, false) // for the history
	switch {
	case e.ok() && e.id == first.id:
		return Pass, fmt.Sprintf("the same fields in reverse order, with other whitespace, were told %s", first.id)
	case e.ok():
		return Fail, fmt.Sprintf("the same fields in reverse order made another resource, %s: the key did not hold", e.id)
	case e.status == http.StatusUnprocessableEntity:
		return Fail, "the same fields in reverse order were refused with 422: the fingerprint hashes the bytes, so a client whose JSON writes fields in another order is refused its own retry"
	}
	return Fail, fmt.Sprintf("the same fields in reverse order were answered %s", e.told())
}

func lostResponse(ctx context.Context, ck *checker) (Verdict, string) {
	key := ck.key("lost-response")
	lane := ck.lane()
	r := ck.charge(key, ck.cfg.KeyForm, ck.body(ck.cfg.Body, key), false, lane)
	if err := ck.lose(ctx, r); err != nil {
		return Unverified, err.Error()
	}
	retry := ck.settle(ctx, r)
	switch {
	case retry.status == http.StatusAccepted || retry.status == http.StatusConflict:
		return Unverified, fmt.Sprintf("%s after the lost request its key was still in progress (%s): the target holds the claim of a request whose client hung up until it expires", settleFor, retry.told())
	case !retry.ok() || retry.id == "":
		return Fail, "the retry after the lost response was answered " + retry.told()
	}
	again := ck.settle(ctx, r)
	ids, read, why := ck.readBack(ctx, key, false)
	switch {
	case again.ok() && again.id != retry.id:
		return Fail, fmt.Sprintf("the retry after the lost response made %s, and the next retry another, %s", retry.id, again.id)
	case read && len(ids) > 1:
		return Fail, fmt.Sprintf("the retry was told %s, but the read-back lists %d resources under the key: the lost request made one, its retry another", retry.id, len(ids))
	case read && (len(ids) == 0 || ids[0] != retry.id):
		return Fail, fmt.Sprintf("the retry was told %s, but the read-back lists %v", retry.id, ids)
	case read:
		return Pass, fmt.Sprintf("the lost request and its retries made one resource, %s, the one the read-back lists", retry.id)
	case retry.replayed:
		return Pass, fmt.Sprintf("the retry was told %s as a replay: the lost request's resource", retry.id)
	}
	return Unverified, fmt.Sprintf("the retry made %s, not marked as a replay: either the lost request never took effect or it made a second resource, which only a read-back can tell (%s)", retry.id, why)
}

func tenants(ctx context.Context, ck *checker) (Verdict, string) {
	if ck.cfg.Token2 == "" {
		return NotApplicable, "needs a second client's token (-token2)"
	}
	key := ck.key("tenants")
	body := ck.body(ck.cfg.Body, key)
	lane1, lane2 := ck.lane(), ck.lane()
	a := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, body, false, lane1))
	if !a.ok() || a.id == "" {
		return Unverified, "the first client's request was answered " + a.told()
	}
	b := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, body, true, lane2))
	switch {
	case b.status == http.StatusUnauthorized || b.status == http.StatusForbidden:
		return Unverified, "the second token was refused: " + b.told()
	case b.ok() && b.id == a.id || b.ok() && bytes.Equal(a.body, b.body):
		return Fail, fmt.Sprintf("the second client was told the first client's resource, %s: keys are shared across clients, so one client sees another's answer (the draft, §5, asks for a key composed with the client)", a.id)
	case !b.ok() || b.id == "":
		return Fail, fmt.Sprintf("the second client's first use of the key was answered %s: keys are shared across clients", b.told())
	}
	a2 := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, body, false, lane1))
	b2 := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, body, true, lane2))
	ck.readBack(ctx, key, false) // for the history: each client's key holds its own
	ck.readBack(ctx, key, true)
	switch {
	case a2.id != a.id || b2.id != b.id:
		return Fail, fmt.Sprintf("the clients made %s and %s, but their retries were told %s and %s", a.id, b.id, a2.told(), b2.told())
	}
	return Pass, fmt.Sprintf("the two clients made %s and %s under one key, and each retry was told its own", a.id, b.id)
}

func retention(ctx context.Context, ck *checker) (Verdict, string) {
	if ck.cfg.Retention == 0 {
		return NotApplicable, "no retention declared (-retention, e.g. the target's key lifetime when it is short)"
	}
	key := ck.key("retention")
	body := ck.body(ck.cfg.Body, key)
	first := ck.settle(ctx, ck.charge(key, ck.cfg.KeyForm, body, false, 0))
	if !first.ok() || first.id == "" {
		return Unverified, "the first request was answered " + first.told()
	}
	wait := ck.cfg.Retention + max(ck.cfg.Retention/5, 500*time.Millisecond)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+settleFor {
		return Unverified, fmt.Sprintf("waiting out the retention (%s) would outlast the check's time (-timeout)", wait)
	}
	if !sleep(ctx, wait) {
		return Unverified, "the check ran out of time waiting out the retention"
	}
	r := ck.charge(key, ck.cfg.KeyForm, body, false, 0)
	r.key.Endpoint += " (after retention)" // a new life of the key, in the history
	e := ck.settle(ctx, r)
	switch {
	case e.ok() && e.id != first.id && !e.replayed:
		return Pass, fmt.Sprintf("%s after the first request, the key made a new resource, %s", wait.Round(time.Millisecond), e.id)
	case e.ok() && e.id == first.id:
		return Fail, fmt.Sprintf("%s after the first request (retention %s), the key still replays %s: it lives longer than declared (and so does the table holding it)", wait.Round(time.Millisecond), ck.cfg.Retention, first.id)
	}
	return Fail, fmt.Sprintf("%s after the first request, the key was answered %s", wait.Round(time.Millisecond), e.told())
}

func checkHistory(_ context.Context, ck *checker) (Verdict, string) {
	h := ck.history()
	if len(h.Ops) == 0 {
		return NotApplicable, "no keyed request was recorded"
	}
	res := history.Check(h, history.DefaultTimeout)
	reads := 0
	for _, o := range h.Ops {
		if o.Kind == history.LedgerRead {
			reads++
		}
	}
	what := fmt.Sprintf("%d operations over %d keys (%d read-backs)", res.Ops, len(h.Keys()), reads)
	switch res.Verdict {
	case history.Linearizable:
		if reads == 0 {
			return Pass, what + ": one order explains every answer (without a read-back, a second resource no answer names stays unseen)"
		}
		return Pass, what + ": one order explains every answer and every read-back"
	case history.Violation:
		return Fail, res.Why
	}
	return Unverified, res.Why
}
