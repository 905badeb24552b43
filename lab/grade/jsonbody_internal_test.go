package grade

import (
	"slices"
	"testing"
)

func TestReorderedKeepsTheFingerprint(t *testing.T) {
	body := []byte(`{"account":"a","amount_cents":1234,"currency":"USD"}`)
	got, err := reordered(body)
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\n  \"currency\" : \"USD\",\n  \"amount_cents\" : 1234,\n  \"account\" : \"a\"\n}"; string(got) != want {
		t.Errorf("reordered:\n%s\nwant:\n%s", got, want)
	}
	if fingerprint(got) != fingerprint(body) {
		t.Error("the reordered body has another fingerprint")
	}
	other, err := bumped(body)
	if err != nil {
		t.Fatal(err)
	}
	if string(other) != `{"account":"a","amount_cents":1235,"currency":"USD"}` || fingerprint(other) == fingerprint(body) {
		t.Errorf("bumped: %s", other)
	}
	if _, err := bumped([]byte(`{"a":"x"}`)); err == nil {
		t.Error("bumped a body without an integer")
	}
}

func TestPointer(t *testing.T) {
	body := []byte(`{"id":"x","response":{"id":7},"a/b":{"~":"t"},"list":[{"id":"p"},"q"]}`)
	for p, want := range map[string]string{"/id": "x", "/response/id": "7", "/a~1b/~0": "t", "/list/0/id": "p", "/list/1": "q", "/none": "", "/list/9": ""} {
		if got := idAt(body, p); got != want {
			t.Errorf("idAt(%q) = %q; want %q", p, got, want)
		}
	}
	ids, err := idsAt([]byte(`{"charges":[{"id":"a"},"b",3]}`), "/charges", "/id")
	if err != nil || !slices.Equal(ids, []string{"a", "b", "3"}) {
		t.Errorf("idsAt = %v, %v", ids, err)
	}
	if _, err := idsAt([]byte(`[{"no":"id"}]`), "", "/id"); err == nil {
		t.Error("idsAt read an element without an id")
	}
}
