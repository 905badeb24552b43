package conformance_test

import (
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/variants"
)

// module is the import path the designs' packages start with.
const module = "github.com/idempotency-lab/lab/"

// TestEveryKeyedDesignRunsTheSuite: the suite runs in each design's own
// package (go test ./variants/memory runs memory's), from one line of a
// test there, rather than a second time over every design here. A design
// registered without that line fails here, which says what to add.
func TestEveryKeyedDesignRunsTheSuite(t *testing.T) {
	for _, v := range variants.Builtin() {
		if !v.RequiresKey {
			continue
		}
		// The package that declares v is the one its Open was written in:
		// ".../variants/memory.Variant.func1".
		fn := runtime.FuncForPC(reflect.ValueOf(v.Open).Pointer()).Name()
		slash := strings.LastIndex(fn, "/")
		pkg := fn[:slash+strings.Index(fn[slash:], ".")]
		name := path.Base(pkg)
		rel := filepath.FromSlash(strings.TrimPrefix(pkg, module)) // from the module's root
		dir := filepath.Join("..", "..", rel)
		line := "conformance.Exercise(t, " + name + ".Variant())"
		test := regexp.MustCompile(`(?m)^func Test\w*\(t \*testing\.T\) \{ ` + regexp.QuoteMeta(line) + ` \}$`)
		files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			found = found || test.Match(b)
		}
		if !found {
			t.Errorf("%s (package %s) does not run the conformance suite: add to %s\n\tfunc TestConformance(t *testing.T) { %s }",
				v.Name, pkg, filepath.Join(rel, "conformance_test.go"), line)
		}
	}
}
