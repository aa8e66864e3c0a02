package logcollector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// One worker directory the collector cannot read (its state.json damaged by hand or by
// a disk fault) is that worker's problem only: queries over every worker answer with
// the others' records and name it, the total bound still trims the others, and only a
// query naming it fails.
func TestDamagedWorkerDirectoryFailsOnlyQueriesNamingIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := startCollector(t, Config{Dir: dir, MaxFileBytes: 100, MaxFiles: 10})
	rec := func(w string, i int) string {
		return fmt.Sprintf(`{"worker_id":%q,"i":%d,"pad":"%s"}`, w, i, strings.Repeat("x", 20))
	}
	for _, w := range []string{"w1", "w2"} {
		a, _ := connect(t, r.ingestURL(), w, "s-"+w)
		for i := 1; i <= 6; i++ {
			a.batch(uint64(i), 0, rec(w, i))
		}
	}
	r.stop()
	files0, _ := filepath.Glob(filepath.Join(dir, "w1", "*"+dataSuffix))
	if len(files0) < 2 {
		t.Fatalf("w1 has %d files, want rotated-out ones to trim", len(files0))
	}
	if err := os.WriteFile(filepath.Join(dir, "w2", stateFile), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}

	r2 := startCollector(t, Config{Dir: dir, MaxFileBytes: 100, MaxFiles: 10, MaxTotalBytes: 1})
	files, _ := filepath.Glob(filepath.Join(dir, "w1", "*"+dataSuffix))
	if len(files) != 1 {
		t.Errorf("w1 keeps %d files, want only its current one: the bound skipped it for w2's damage", len(files))
	}
	if n := testutil.ToFloat64(r2.c.met.budgetDeletes); n != float64(len(files0)-1) {
		t.Errorf("budget_deleted_files_total = %v, want w1's %d rotated-out files", n, len(files0)-1)
	}

	code, body := r2.get("/logs")
	var resp struct {
		Records []struct {
			WorkerID string `json:"worker_id"`
		} `json:"records"`
		Count      int      `json:"count"`
		Unreadable []string `json:"unreadable_workers"`
	}
	if err := json.Unmarshal(body, &resp); code != 200 || err != nil {
		t.Fatalf("all workers: %d %s (%v)", code, body, err)
	}
	if resp.Count != len(lines(t, dir, "w1")) || resp.Records[0].WorkerID != "w1" || strings.Join(resp.Unreadable, ",") != "w2" {
		t.Errorf("all workers: %s, want w1's records and w2 named unreadable", body)
	}
	if code, body := r2.get("/logs?worker=w1"); code != 200 || strings.Contains(string(body), "unreadable") {
		t.Errorf("worker=w1: %d %s", code, body)
	}
	if code, body := r2.get("/logs?worker=w2"); code != 500 {
		t.Errorf("worker=w2: %d %s, want 500", code, body)
	}
}

// A query whose caller has gone stops reading files: over every worker it can read
// gigabytes, and a client that timed out and retried would start another beside it.
func TestQueryStopsWhenTheCallerIsGone(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	a.batch(1, 0, `{"level":"info"}`)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	q, err := parseLogQuery("", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, worker := range []string{"", "w1"} {
		q.worker = worker
		if res, err := r.c.store.query(ctx, q); !errors.Is(err, context.Canceled) {
			t.Errorf("worker %q: %d records, err %v; want context.Canceled", worker, len(res.records), err)
		}
	}
}
