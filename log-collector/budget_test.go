package logcollector

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// With MaxTotalBytes the files of all workers together stay within the bound: the
// oldest rotated-out files go first, whichever worker's they are, and each worker's
// current file stays. Without it, every pod name a rollout brings keeps MaxFiles
// files for good.
func TestTotalBytesBoundDeletesTheOldestFilesFirst(t *testing.T) {
	t.Parallel()
	const budget = 300
	r := startCollector(t, Config{MaxFileBytes: 100, MaxFiles: 10, MaxTotalBytes: budget})
	rec := func(i int) string { return fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", 20)) } // 35-36 bytes: two a file
	old, _ := connect(t, r.ingestURL(), "a-gone", "s1")
	for i := 1; i <= 20; i++ {
		old.batch(uint64(i), 0, rec(i))
	}
	fresh, _ := connect(t, r.ingestURL(), "b-new", "s2")
	for i := 1; i <= 10; i++ {
		fresh.batch(uint64(i), 0, rec(100+i))
	}
	var total int64
	for _, w := range []string{"a-gone", "b-new"} {
		files, _ := filepath.Glob(filepath.Join(r.dir, w, "*.jsonl"))
		for _, f := range files {
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			total += fi.Size()
		}
	}
	// Trimmed at each rotation: since the last one, a current file may have grown by
	// up to a file's size.
	if total > budget+100 {
		t.Errorf("files hold %d bytes, over the bound of %d and a current file", total, budget)
	}
	// The earlier worker lost all but its current file before the later one lost any.
	if got := lines(t, r.dir, "a-gone"); len(got) != 2 || got[1] != rec(20) {
		t.Errorf("a-gone keeps %q, want only its current file (records 19 and 20)", got)
	}
	if got := lines(t, r.dir, "b-new"); len(got) < 4 || got[len(got)-1] != rec(110) {
		t.Errorf("b-new keeps %q, want its newest files", got)
	}
	if n := testutil.ToFloat64(r.c.met.budgetDeletes); n < 9 {
		t.Errorf("budget_deleted_files_total = %v, want at least the 9 rotated-out files of a-gone", n)
	}
}

// A bound below what the current files hold deletes every rotated-out file and keeps
// the current ones, which state.json points at; a start applies a lowered bound.
func TestTotalBytesBoundKeepsCurrentFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := startCollector(t, Config{Dir: dir, MaxFileBytes: 100, MaxFiles: 10})
	rec := func(i int) string { return fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", 20)) }
	for _, w := range []string{"w1", "w2"} {
		a, _ := connect(t, r.ingestURL(), w, "s-"+w)
		for i := 1; i <= 6; i++ {
			a.batch(uint64(i), 0, rec(i))
		}
	}
	r.stop()
	r2 := startCollector(t, Config{Dir: dir, MaxFileBytes: 100, MaxFiles: 10, MaxTotalBytes: 1})
	for _, w := range []string{"w1", "w2"} {
		files, _ := filepath.Glob(filepath.Join(dir, w, "*.jsonl"))
		if len(files) != 1 || filepath.Base(files[0]) != fmt.Sprintf("%08d.jsonl", readState(t, dir, w).File) {
			t.Errorf("%s keeps %v, want only its current file", w, files)
		}
		if got := lines(t, dir, w); len(got) != 2 || got[1] != rec(6) {
			t.Errorf("%s: %q", w, got)
		}
	}
	if n := testutil.ToFloat64(r2.c.met.budgetDeletes); n != 4 {
		t.Errorf("budget_deleted_files_total = %v, want 4", n)
	}
}
