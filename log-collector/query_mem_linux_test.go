//go:build linux

package logcollector

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// GET /logs without worker keeps the most recent `limit` records of all workers. It
// must not hold `limit` records of every worker at once: with every pod that ever ran
// keeping a directory, a query with limit=10000 would hold tens of millions of
// records and take the collector down.
//
// The query is paused inside its scan of the last worker (whose oldest data file is a
// FIFO the test holds open), and the heap is measured there. Not parallel: no other
// test allocates meanwhile.
func TestAllWorkersQueryMemoryIsBoundedByLimit(t *testing.T) {
	dir := t.TempDir()
	const (
		workers = 60
		perW    = 400
		limit   = 400
	)
	pad := strings.Repeat("x", 160)
	for w := range workers {
		wdir := filepath.Join(dir, fmt.Sprintf("w%03d", w))
		if err := os.Mkdir(wdir, 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(wdir, "00000001.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		bw := bufio.NewWriter(f)
		for i := range perW {
			fmt.Fprintf(bw, `{"level":"info","time":"2026-03-01T12:%02d:%02dZ","w":%d,"pad":%q}`+"\n", i/60%60, i%60, w, pad)
		}
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	// The last worker: file 1 is a FIFO (read whole, as it is not the current file),
	// file 2 the current one.
	last := filepath.Join(dir, "zzz")
	if err := os.Mkdir(last, 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(last, "00000001.jsonl")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	if err := os.WriteFile(filepath.Join(last, "00000002.jsonl"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := startCollector(t, Config{Dir: dir})

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	type result struct {
		res queryResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		q, err := parseLogQuery(fmt.Sprintf("limit=%d", limit), time.Now())
		if err == nil {
			var res queryResult
			res, err = r.c.store.query(context.Background(), q)
			done <- result{res, err}
			return
		}
		done <- result{err: err}
	}()
	wr, err := os.OpenFile(fifo, os.O_WRONLY, 0) // returns once the query has opened it
	if err != nil {
		t.Fatal(err)
	}
	var during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&during)
	wr.Close() // the FIFO ends: the query goes on
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if n := len(res.res.records); n != limit || !res.res.truncated {
		t.Fatalf("count %d truncated %v, want %d true", n, res.res.truncated, limit)
	}
	held := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew by %d KiB during the scan", held>>10)
	recordBytes := int64(len(pad) + 80)
	if bound := 8 * limit * recordBytes; held > bound {
		t.Fatalf("a query with limit %d over %d workers held %d KiB during its scan, more than %d KiB (about %d records)",
			limit, workers, held>>10, bound>>10, held/recordBytes)
	}
}
