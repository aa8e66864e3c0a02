package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every fuzz target runs in CI (bounded) and in `task fuzz`: a new target left out of
// either is fuzzed by nobody.
func TestEveryFuzzTargetIsRun(t *testing.T) {
	root := filepath.Join("..")
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadFile(filepath.Join(root, "Taskfile.yml"))
	if err != nil {
		t.Fatal(err)
	}
	fuzzFunc := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
	found := 0
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pkg := "./" + filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, root+string(filepath.Separator))))
		for _, m := range fuzzFunc.FindAllSubmatch(src, -1) {
			found++
			want := regexp.MustCompile(`-fuzz '\^` + string(m[1]) + `\$' .*` + regexp.QuoteMeta(pkg) + `\s*$`)
			for name, file := range map[string][]byte{".ci/run": ci, "Taskfile.yml": tasks} {
				if !hasLine(file, want) {
					t.Errorf("%s in %s is not run by %s", m[1], pkg, name)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 10 {
		t.Fatalf("found %d fuzz targets; the walk is looking in the wrong place", found)
	}
}

func hasLine(file []byte, re *regexp.Regexp) bool {
	for l := range strings.SplitSeq(string(file), "\n") {
		if re.MatchString(l) {
			return true
		}
	}
	return false
}
