package lab_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
)

func TestParseJoinRequest(t *testing.T) {
	for body, want := range map[string]string{"": "", "  ": "", `{"code":"retry-safely"}`: "retry-safely", ` {"code": "x"} `: "x", `{}`: ""} {
		if got, err := lab.ParseJoinRequest(strings.NewReader(body)); err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", body, got, err, want)
		}
	}
	for _, body := range []string{`{"code":"x"}]`, `{"code":"x"} x`, `{"code":"x"}{"code":"y"}`, `{"code":"x","code":"y"}`,
		`{"code":null}`, `{"code":7}`, `{"code":""}`, `{"other":"x"}`, "{\"code\":\"\xff\"}", `[]`, `"x"`} {
		_, err := lab.ParseJoinRequest(strings.NewReader(body))
		var ie *lab.InvalidError
		if !errors.As(err, &ie) {
			t.Errorf("%q: accepted (%v)", body, err)
		}
	}
}
