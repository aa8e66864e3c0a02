package logcollector

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

// skewedClock is a store clock that the test can move on, as if that much time had
// passed since the files were written.
func skewedClock() (now func() time.Time, skew *atomic.Int64) {
	skew = new(atomic.Int64)
	return func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }, skew
}

// A gone worker (no stream, nothing written for goneAfter) loses its current file too,
// and with it its directory: a rollout's old pod names do not keep a file each for
// good. A connected worker keeps its current file however old, and a gone worker that
// comes back starts afresh, with a note of what it sent before.
func TestTotalBytesBoundRemovesGoneWorkers(t *testing.T) {
	t.Parallel()
	const budget = 300
	now, skew := skewedClock()
	r := startCollector(t, Config{MaxFileBytes: 100, MaxFiles: 10, MaxTotalBytes: budget, hooks: &testHooks{now: now}})
	rec := func(i int) string { return fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", 20)) } // two a file
	idle, _ := connect(t, r.ingestURL(), "c-idle", "s0")
	idle.batch(1, 0, rec(0))
	gone, _ := connect(t, r.ingestURL(), "a-gone", "s1")
	for i := 1; i <= 4; i++ {
		gone.batch(uint64(i), 0, rec(i))
	}
	gone.ws.Close()
	waitStreams(t, r.c.met, 1)
	skew.Store(int64(goneAfter + time.Minute))
	fresh, _ := connect(t, r.ingestURL(), "b-new", "s2")
	for i := 1; i <= 8; i++ { // rotations trim: a-gone's files are the oldest
		fresh.batch(uint64(i), 0, rec(100+i))
	}
	if _, err := os.Stat(filepath.Join(r.dir, "a-gone")); !os.IsNotExist(err) {
		t.Errorf("a-gone's directory: %v, want it removed", err)
	}
	if code, _ := r.get("/logs?worker=a-gone"); code != 404 {
		t.Errorf("GET /logs of the removed worker: %d, want 404", code)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "a-gone")); !os.IsNotExist(err) {
		t.Errorf("a-gone's directory after a query: %v, want it still removed", err)
	}
	if got := lines(t, r.dir, "c-idle"); len(got) != 1 {
		t.Errorf("connected c-idle keeps %q, want its current file", got)
	}
	if code, body := r.get("/logs?limit=100"); code != 200 || strings.Contains(string(body), `"i":4,`) {
		t.Errorf("GET /logs over all workers: %d %s", code, body)
	}
	back, last := connect(t, r.ingestURL(), "a-gone", "s1")
	if last != 0 {
		t.Errorf("a-gone back: welcome last_seq %d, want 0 (its state went with it)", last)
	}
	back.batch(5, 0, rec(5))
	got := lines(t, r.dir, "a-gone")
	if len(got) != 2 || got[1] != rec(5) || !strings.Contains(got[0], `"missing_to":4`) || !strings.Contains(got[0], "--max-total-bytes") {
		t.Errorf("a-gone back writes %q, want a note of the batches removed and record 5", got)
	}
}

// A worker that has not streamed since the collector started counts as gone only
// goneAfter after the start, however old its files: at a restart every worker is
// quiet until it reconnects, and a live one that has logged nothing for an hour must
// keep its files.
func TestTotalBytesBoundSparesQuietWorkersAfterARestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rec := func(i int) string { return fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", 20)) }
	r := startCollector(t, Config{Dir: dir, MaxFileBytes: 100, MaxFiles: 10})
	quiet, _ := connect(t, r.ingestURL(), "a-quiet", "s1")
	quiet.batch(1, 0, rec(1))
	r.stop()
	files, _ := filepath.Glob(filepath.Join(dir, "a-quiet", "*.jsonl"))
	for _, f := range files { // last written long before the restart
		old := time.Now().Add(-2 * goneAfter)
		if err := os.Chtimes(f, old, old); err != nil {
			t.Fatal(err)
		}
	}

	now, skew := skewedClock()
	r2 := startCollector(t, Config{Dir: dir, MaxFileBytes: 100, MaxFiles: 10, MaxTotalBytes: 150, hooks: &testHooks{now: now}})
	fresh, _ := connect(t, r2.ingestURL(), "b-new", "s2")
	for i := 1; i <= 6; i++ {
		fresh.batch(uint64(i), 0, rec(100+i))
	}
	if got := lines(t, dir, "a-quiet"); len(got) != 1 || got[0] != rec(1) {
		t.Fatalf("a-quiet right after the restart keeps %q, want its current file", got)
	}
	skew.Store(int64(goneAfter + time.Minute))
	for i := 7; i <= 10; i++ {
		fresh.batch(uint64(i), 0, rec(100+i))
	}
	if _, err := os.Stat(filepath.Join(dir, "a-quiet")); !os.IsNotExist(err) {
		t.Errorf("a-quiet's directory goneAfter after the restart: %v, want it removed", err)
	}
}
