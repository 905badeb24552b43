package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckHistory checks recorded histories as an attendee would: one
// whose ledger read shows a second charge the answers hide is a violation
// (exit 1) with its sentence, and drawn; the same without the ledger
// reads is linearizable; a line it cannot read is refused.
func TestCheckHistory(t *testing.T) {
	dir := t.TempDir()
	const key = `"key":{"tenant":"acme","endpoint":"redis","key":"k1"}`
	lines := []string{
		`{"run":"run_recorded"}`,
		`{"op":{"kind":"ledger_read","before":true,"call_us":-40,"return_us":-10,` + key + `}}`,
		`{"op":{"kind":"charge","client":1,"call_us":0,"return_us":20,` + key + `,"fingerprint":"f"}}`,
		`{"op":{"kind":"charge","client":2,"call_us":30,"return_us":90,` + key + `,"fingerprint":"f","status":201,"charge_id":"ch_second","replayed":true}}`,
		`{"op":{"kind":"ledger_read","call_us":100,"return_us":120,` + key + `,"charges":["ch_first","ch_second"]}}`,
		`{"event":{"name":"crash","at_us":15,"client":1}}`,
	}
	write := func(name string, ls ...string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Join(ls, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	full := write("full.ndjson", lines...)
	var out, errs bytes.Buffer
	page := filepath.Join(dir, "run.html")
	err := run(t.Context(), []string{"check-history", "-html", page, full}, &out, &errs)
	if !errors.Is(err, errNotLinearizable) || !strings.HasPrefix(out.String(), "violation: 4 operations over 1 keys") ||
		!strings.Contains(out.String(), "attempt 2 was told ch_second, but the ledger holds ch_first and ch_second") {
		t.Fatalf("full history: %v\n%s", err, out.String())
	}
	if html, err := os.ReadFile(page); err != nil || !bytes.Contains(html, []byte("<html")) {
		t.Fatalf("the picture: %v (%d bytes)", err, len(html))
	}
	out.Reset()
	answersOnly := write("answers.ndjson", lines[0], lines[2], lines[3], lines[5])
	if err := run(t.Context(), []string{"check-history", answersOnly}, &out, &errs); err != nil || !strings.HasPrefix(out.String(), "linearizable: 2 operations") {
		t.Fatalf("answers alone: %v\n%s", err, out.String())
	}
	bad := write("bad.ndjson", lines[0], `{"op":{"kind":"charge","client":1,"call_us":5,"return_us":1,`+key+`}}`)
	if err := run(t.Context(), []string{"check-history", bad}, &out, &errs); err == nil || errors.Is(err, errNotLinearizable) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("an unreadable history: %v", err)
	}
}
