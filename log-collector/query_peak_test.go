package logcollector

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// fillWorkers writes records records of about recordBytes each for every one of
// workers workers straight into dir, their times interleaved across workers.
func fillWorkers(tb testing.TB, dir string, workers, records, recordBytes int) {
	tb.Helper()
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	pad := strings.Repeat("x", max(recordBytes-100, 0))
	for w := range workers {
		wdir := filepath.Join(dir, fmt.Sprintf("w%d", w))
		if err := os.Mkdir(wdir, 0o755); err != nil {
			tb.Fatal(err)
		}
		f, err := os.Create(filepath.Join(wdir, "00000001.jsonl"))
		if err != nil {
			tb.Fatal(err)
		}
		bw := bufio.NewWriterSize(f, 1<<20)
		for i := range records {
			t := base.Add(time.Duration(i*workers+w) * time.Millisecond)
			fmt.Fprintf(bw, `{"level":"info","time":%q,"w":%d,"i":%d,"pad":%q}`+"\n", t.Format(time.RFC3339Nano), w, i, pad)
		}
		if err := bw.Flush(); err != nil {
			tb.Fatal(err)
		}
		if err := f.Close(); err != nil {
			tb.Fatal(err)
		}
	}
}

// queryPeak runs GET path on r from queries clients at once, each reading its answer
// as fast as it comes, and returns how far the heap rose above where it stood before
// (objects live or not yet collected, sampled every millisecond) and the bytes of one
// answer.
func queryPeak(tb testing.TB, r *running, path string, queries int) (peak uint64, body int64) {
	tb.Helper()
	runtime.GC()
	var base uint64
	sampleHeap(&base)()
	stop := sampleHeap(&peak)
	bodies := make([]int64, queries)
	var wg sync.WaitGroup
	for i := range bodies {
		wg.Go(func() {
			resp, err := http.Get("http://" + r.addr + path)
			if err != nil {
				tb.Error(err)
				return
			}
			defer resp.Body.Close()
			n, err := io.Copy(io.Discard, resp.Body)
			if err != nil || resp.StatusCode != http.StatusOK {
				tb.Errorf("GET %s: %d, %d bytes, %v", path, resp.StatusCode, n, err)
			}
			bodies[i] = n
		})
	}
	wg.Wait()
	stop()
	return peak - min(base, peak), bodies[0]
}

// BenchmarkMaximalQuery measures the heap GET /logs takes at its largest, one query
// and DefaultMaxActiveQueries at once: every worker holds more than MaxQueryBytes of
// matching records under limit=10000, so the byte bound, not the limit, decides what
// is kept.
//
//	go test -run '^$' -bench MaximalQuery -benchtime 3x -count 3 ./log-collector
func BenchmarkMaximalQuery(b *testing.B) {
	const (
		workers     = 3
		records     = MaxQueryLimit
		recordBytes = 7 << 10 // 10,000 of them: 70 MiB, over MaxQueryBytes
	)
	dir := b.TempDir()
	fillWorkers(b, dir, workers, records, recordBytes)
	r := startCollector(b, Config{Dir: dir})
	for _, queries := range []int{1, DefaultMaxActiveQueries} {
		b.Run(fmt.Sprintf("queries=%d", queries), func(b *testing.B) {
			b.ReportAllocs()
			var peak uint64
			for range b.N {
				p, n := queryPeak(b, r, fmt.Sprintf("/logs?limit=%d", MaxQueryLimit), queries)
				peak = max(peak, p)
				b.SetBytes(n * int64(queries))
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(peak)/MaxQueryBytes/float64(queries), "peak/budget/query")
		})
	}
}
