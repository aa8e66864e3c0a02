package logcollector

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// One GET /logs holds at most its byte budget of records: not a heap of that size per
// worker beside the merged list, nor the whole answer encoded in one buffer besides.
// The GC runs often here (GOGC=10) so that the heap measured is close to what is live.
// Not parallel: no other test allocates meanwhile.
func TestLogsQueryHeapStaysWithinBudget(t *testing.T) {
	const budget = 16 << 20
	dir := t.TempDir()
	fillWorkers(t, dir, 2, MaxQueryLimit, 2<<10) // 20 MiB a worker, over the budget
	r := startCollector(t, Config{Dir: dir, hooks: &testHooks{queryBytes: budget}})
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	peak, n := queryPeak(t, r, fmt.Sprintf("/logs?limit=%d", MaxQueryLimit), 1)
	t.Logf("heap rose by %.1f MiB for an answer of %.1f MiB", float64(peak)/(1<<20), float64(n)/(1<<20))
	if n < budget*9/10 {
		t.Fatalf("the answer holds %d bytes, want about the budget, %d", n, budget)
	}
	if limit := uint64(budget) * 3 / 2; peak > limit {
		t.Fatalf("the heap rose by %.1f MiB for a query of a %d MiB budget, more than %d MiB",
			float64(peak)/(1<<20), budget>>20, limit>>20)
	}
}

// Beyond MaxActiveQueries a query is refused at once with 503, Retry-After and a JSON
// error, rather than run beside the others: each may hold MaxQueryBytes.
func TestLogsQueriesBeyondMaxActiveQueriesAreRefused(t *testing.T) {
	t.Parallel()
	held, release := make(chan struct{}, 8), make(chan struct{})
	r := startCollector(t, Config{MaxActiveQueries: 2, hooks: &testHooks{queryHeld: func() {
		held <- struct{}{}
		<-release
	}}})
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	a.batch(1, 0, `{"level":"info","msg":"one"}`)

	type answer struct {
		code  int
		retry string
		body  []byte
		err   error
	}
	get := func(out chan<- answer) {
		resp, err := http.Get("http://" + r.addr + "/logs")
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		out <- answer{resp.StatusCode, resp.Header.Get("Retry-After"), body, err}
	}
	running := make(chan answer, 2)
	go get(running)
	go get(running)
	<-held
	<-held
	third := make(chan answer, 1)
	go get(third)
	select {
	case <-held:
		close(release)
		t.Fatal("a third query ran beside two with MaxActiveQueries 2")
	case ans := <-third:
		var body errorBody
		if ans.err != nil || ans.code != http.StatusServiceUnavailable || ans.retry == "" ||
			json.Unmarshal(ans.body, &body) != nil || !strings.Contains(body.Error, "--max-active-queries") {
			t.Errorf("third query: %d, Retry-After %q, %s (%v); want 503, Retry-After, a JSON error naming --max-active-queries",
				ans.code, ans.retry, ans.body, ans.err)
		}
	}
	close(release)
	for range 2 {
		if ans := <-running; ans.err != nil || ans.code != http.StatusOK {
			t.Errorf("a query that held a slot: %d %s (%v)", ans.code, ans.body, ans.err)
		}
	}
	if n := testutil.ToFloat64(r.c.met.queriesRefused); n != 1 {
		t.Errorf("queries_refused_total = %v, want 1", n)
	}
	if code, body := r.get("/logs"); code != http.StatusOK { // the slots came back
		t.Errorf("a query after the others: %d %s", code, body)
	}
}

// A client that stops reading is cut off once QueryWriteTimeout has passed, and the
// query's slot and records are freed; without a deadline it pinned them for as long as
// it kept the connection open.
func TestLogsAnswerToAClientThatStopsReadingIsCutOff(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fillWorkers(t, dir, 1, 3000, 16<<10) // an answer of 48 MiB: more than the sockets buffer
	written := make(chan error, 4)
	r := startCollector(t, Config{Dir: dir, MaxActiveQueries: 1, QueryWriteTimeout: 200 * time.Millisecond,
		hooks: &testHooks{queryWritten: written}})
	conn, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "GET /logs?limit=%d HTTP/1.1\r\nHost: collector\r\n\r\n", MaxQueryLimit); err != nil {
		t.Fatal(err)
	}
	select { // and never read
	case err := <-written:
		if err == nil {
			t.Fatal("a 48 MiB answer was written whole to a client that read none of it")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the answer to a client that stopped reading was still being written after 30s (QueryWriteTimeout 200ms)")
	}
	if code, body := r.get("/logs?limit=1"); code != http.StatusOK {
		t.Errorf("a query after the cut-off one: %d %s, want 200 (its slot freed)", code, body)
	}
}

// writeLogs streams what encoding/json wrote when it built the answer whole, byte for
// byte: compacted records, HTML-escaped, a final newline.
func TestWriteLogsWritesWhatEncodingJSONWrites(t *testing.T) {
	t.Parallel()
	lines := []string{
		`{"a": 1, "b" : [1, 2], "c": {"d": null}}`,
		`{"msg":"<b>&amp;</b> -> ok"}`,
		"{\"msg\":\"line\u2028separator\u2029paragraph\"}",
		`{"msg":"é ü 日本 🙂","esc":"\"q\" \\ \n \u0041 \u2028"}`,
		`{"n":1e3,"f":-0.5,"t":true}`,
		`{}`,
	}
	for _, c := range []struct {
		name       string
		lines      []string
		truncated  bool
		unreadable []string
	}{
		{"none", nil, false, nil},
		{"records", lines, true, nil},
		{"unreadable workers", lines[:2], false, []string{"w2", "<w3>"}},
	} {
		var res queryResult
		want := logsResponse{Records: []json.RawMessage{}, Count: len(c.lines), Truncated: c.truncated, UnreadableWorkers: c.unreadable}
		for _, l := range c.lines {
			res.records = append(res.records, matchedRecord{raw: []byte(l)})
			want.Records = append(want.Records, json.RawMessage(l))
		}
		res.truncated, res.unreadableWorkers = c.truncated, c.unreadable
		var got, enc bytes.Buffer
		if err := writeLogs(&got, res); err != nil {
			t.Fatal(err)
		}
		if err := json.NewEncoder(&enc).Encode(want); err != nil {
			t.Fatal(err)
		}
		if got.String() != enc.String() {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got.Bytes(), enc.Bytes())
		}
	}
}

// What a query returns is every match after some point: a small old record does not
// stay where a larger, more recent one was dropped for the byte budget, within a
// worker's file or across workers.
func TestLogsQueryReturnsEveryMatchAfterAPoint(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{hooks: &testHooks{queryBytes: 1000}})
	rec := func(sec, size int) string {
		return fmt.Sprintf(`{"level":"info","time":"2026-03-01T12:00:%02dZ","sec":%d,"pad":%q}`, sec, sec, strings.Repeat("x", size-70))
	}
	older, newer, oldest := rec(2, 600), rec(3, 500), rec(1, 100)
	one, _ := connect(t, r.ingestURL(), "one", "s1")
	one.batch(1, 0, older, newer, oldest) // oldest last in the file
	w1, _ := connect(t, r.ingestURL(), "w1", "s1")
	w1.batch(1, 0, older, newer)
	w2, _ := connect(t, r.ingestURL(), "w2", "s1")
	w2.batch(1, 0, oldest)
	for _, path := range []string{"/logs?worker=one", "/logs?worker=w1", "/logs"} {
		code, body := r.get(path)
		var resp struct {
			Records []struct{ Sec int }
		}
		if code != http.StatusOK || json.Unmarshal(body, &resp) != nil {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		var secs []int
		for _, rec := range resp.Records {
			secs = append(secs, rec.Sec)
		}
		if fmt.Sprint(secs) != "[3]" {
			t.Errorf("%s returned records of seconds %v, want [3]: second 2 did not fit, so neither does 1", path, secs)
		}
	}
}

// A worker whose files fail to read midway is left out of a query over every worker,
// and the answer is what it would be without that worker, also where its records had
// displaced others' before it failed.
func TestLogsQueryLeavesOutAWorkerThatFailsMidway(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(worker string, secs ...int) {
		var b strings.Builder
		for _, s := range secs {
			fmt.Fprintf(&b, `{"level":"info","time":"2026-03-01T12:00:%02dZ","worker":%q,"sec":%d}`+"\n", s, worker, s)
		}
		if err := os.MkdirAll(filepath.Join(dir, worker), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, worker, "00000001.jsonl"), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("w1", 1, 2, 3, 4, 5)
	write("w2", 6, 7, 8, 9, 10) // newer than all of w1's
	// w2's second file cannot be read (a directory where a file should be): its
	// records of the first are in hand when it fails.
	if err := os.Mkdir(filepath.Join(dir, "w2", "00000002.jsonl"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := startCollector(t, Config{Dir: dir})
	for _, c := range []struct {
		limit     int
		want      string
		truncated bool
	}{
		{3, "[3 4 5]", true},        // w2's records had pushed all of w1's out
		{100, "[1 2 3 4 5]", false}, // w2's displaced none
	} {
		code, body := r.get(fmt.Sprintf("/logs?limit=%d", c.limit))
		var resp struct {
			Records           []struct{ Sec int }
			Truncated         bool
			UnreadableWorkers []string `json:"unreadable_workers"`
		}
		if code != http.StatusOK || json.Unmarshal(body, &resp) != nil {
			t.Fatalf("limit %d: %d %s", c.limit, code, body)
		}
		var secs []int
		for _, rec := range resp.Records {
			secs = append(secs, rec.Sec)
		}
		if fmt.Sprint(secs) != c.want || resp.Truncated != c.truncated || fmt.Sprint(resp.UnreadableWorkers) != "[w2]" {
			t.Errorf("limit %d: records %v, truncated %v, unreadable %v; want %s, %v, [w2]",
				c.limit, secs, resp.Truncated, resp.UnreadableWorkers, c.want, c.truncated)
		}
	}
}
