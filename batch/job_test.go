package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeDispatcher is a real HTTP server speaking /run-task; answer decides each reply.
type fakeDispatcher struct {
	srv *httptest.Server
	// answer returns the status and body for a request; nth counts the requests for
	// that line so far (1 for the first). It may block on ctx (the request's).
	answer func(ctx context.Context, req runTaskBody, line, nth int) (int, string)

	mu       sync.Mutex
	reqs     []runTaskBody // in arrival order
	seen     map[int]int   // line → requests
	answered []int         // lines in the order their 200s were sent
	// arrivedCh gets each line when its first request arrives.
	arrivedCh chan int
	// answeredCh gets each line whose 200 has been written.
	answeredCh chan int
}

// noKeepAlive posts to the job's control address: another test's httptest Close closes
// the default transport's idle connections, and a POST that had just taken one fails
// (it is not retried, as a GET is).
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// answerFirstLineOnly answers line 1 and holds every later line until the job lets go
// of it: a job stopped mid-run, with one line written.
func answerFirstLineOnly(ctx context.Context, _ runTaskBody, line, _ int) (int, string) {
	if line > 1 {
		<-ctx.Done()
	}
	return http.StatusOK, ""
}

func newFakeDispatcher(t *testing.T, answer func(ctx context.Context, req runTaskBody, line, nth int) (int, string)) *fakeDispatcher {
	t.Helper()
	f := &fakeDispatcher{answer: answer, seen: map[int]int{}, arrivedCh: make(chan int, 100000), answeredCh: make(chan int, 100000)}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req runTaskBody
		if r.URL.Path != "/run-task" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
			return
		}
		line := lineOfID(req.TaskID)
		f.mu.Lock()
		f.reqs = append(f.reqs, req)
		f.seen[line]++
		nth := f.seen[line]
		f.mu.Unlock()
		if nth == 1 {
			f.arrivedCh <- line
		}
		status, body := http.StatusOK, ""
		if f.answer != nil {
			status, body = f.answer(r.Context(), req, line, nth)
		}
		if status == http.StatusOK && body == "" {
			body = completed(req)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
		if status == http.StatusOK {
			w.(http.Flusher).Flush()
			f.mu.Lock()
			f.answered = append(f.answered, line)
			f.mu.Unlock()
			f.answeredCh <- line
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// completed is the dispatcher's 200 answer; the result echoes the parameters so a test
// can tell which input line an output line answers.
func completed(req runTaskBody) string {
	b, _ := json.Marshal(map[string]any{"task_id": req.TaskID, "status": "completed", "label": req.Label, "worker_id": "w1",
		"label_miss": false, "result": map[string]json.RawMessage{"echo": req.ParametersJSON}})
	return string(b)
}

func (f *fakeDispatcher) requests(line int) []runTaskBody {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []runTaskBody
	for _, r := range f.reqs {
		if lineOfID(r.TaskID) == line {
			out = append(out, r)
		}
	}
	return out
}

// lineOfID reads the input line number out of a task id "<job>-<line>[-r<k>]".
func lineOfID(id string) int {
	parts := strings.Split(id, "-")
	if strings.HasPrefix(parts[len(parts)-1], "r") {
		parts = parts[:len(parts)-1]
	}
	n, _ := strconv.Atoi(parts[len(parts)-1])
	return n
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not synchronising
	}
}

// taskLines are n input lines over labels, {"id": i, "label": ..., "parameters": {"n": i}}.
func taskLines(n int, labels ...string) []string {
	if len(labels) == 0 {
		labels = []string{"label-1"}
	}
	lines := make([]string, n)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"id":%d,"label":%q,"task_type":"sample_task","parameters":{"n":%d}}`, i+1, labels[i%len(labels)], i+1)
	}
	return lines
}

// setup writes the input and returns a config pointing at f with files in a temp dir.
func setup(t *testing.T, f *fakeDispatcher, lines []string) Config {
	t.Helper()
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return Config{DispatcherURL: f.srv.URL, Input: in, Output: filepath.Join(dir, "out.jsonl"), Concurrency: 4, CheckpointInterval: 10 * time.Millisecond,
		RetryDelay: time.Millisecond}
}

// runBounded is Run with a deadline, so that a stuck job fails the test.
func runBounded(cfg Config) (Summary, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return Run(ctx, cfg)
}

func run(t *testing.T, cfg Config) Summary {
	t.Helper()
	s, err := runBounded(cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return s
}

// runAsync starts the job on a goroutine of its own; wait, called on the test's
// goroutine, returns its summary or fails the test. (t.Fatal on the job's goroutine
// would end that goroutine without a summary and leave the test waiting for one.)
func runAsync(t *testing.T, cfg Config) (wait func() Summary) {
	type result struct {
		s   Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := runBounded(cfg)
		done <- result{s, err}
	}()
	return func() Summary {
		t.Helper()
		r := <-done
		if r.err != nil {
			t.Fatalf("Run: %v", r.err)
		}
		return r.s
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 {
		return nil
	}
	if b[len(b)-1] != '\n' {
		t.Fatalf("%s does not end with a newline", path)
	}
	return strings.Split(string(b[:len(b)-1]), "\n")
}

// checkOutput asserts the output has exactly n lines, line i answering input line i:
// completed with the echo of parameter n=i, or rejected when i is in rejected.
func checkOutput(t *testing.T, path string, n int, rejected ...int) {
	t.Helper()
	lines := readLines(t, path)
	if len(lines) != n {
		t.Fatalf("output has %d lines, want %d", len(lines), n)
	}
	for i, l := range lines {
		var o struct {
			outputLine
			Result struct {
				Echo struct{ N int } `json:"echo"`
			} `json:"result"`
		}
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatalf("output line %d is not JSON: %v: %s", i+1, err, l)
		}
		if o.Line != int64(i+1) {
			t.Fatalf("output line %d says line %d", i+1, o.Line)
		}
		if slices.Contains(rejected, i+1) {
			if o.Status != "rejected" || o.Error == "" {
				t.Errorf("output line %d should be a rejected placeholder: %s", i+1, l)
			}
			continue
		}
		if o.Status != "completed" || o.Result.Echo.N != i+1 {
			t.Errorf("output line %d is not the result for input line %d: %s", i+1, i+1, l)
		}
	}
}

func TestOutputInOrderWhenCompletedOutOfOrder(t *testing.T) {
	t.Parallel()
	for _, order := range []Order{OrderLabel, OrderFile} {
		t.Run(string(order), func(t *testing.T) {
			t.Parallel()
			const n, block = 40, 8
			// Every task waits for its gate; the gates open last line of each block first.
			gates := make([]chan struct{}, n+1)
			for i := range gates {
				gates[i] = make(chan struct{})
			}
			f := newFakeDispatcher(t, func(ctx context.Context, _ runTaskBody, line, _ int) (int, string) {
				select {
				case <-gates[line]:
				case <-ctx.Done():
				}
				return http.StatusOK, ""
			})
			go func() {
				// Take the arrivals a block at a time and open their gates newest
				// first, one at a time: the next opens once this answer is out, so
				// completions really come in this order.
				for remaining := n; remaining > 0; remaining -= block {
					group := make([]int, min(block, remaining))
					for i := range group {
						group[i] = <-f.arrivedCh
					}
					for _, line := range slices.Backward(group) {
						close(gates[line])
						<-f.answeredCh
					}
				}
			}()
			cfg := setup(t, f, taskLines(n, "a", "b"))
			cfg.Concurrency, cfg.Order, cfg.Lookahead = block, order, block
			s := run(t, cfg)
			checkOutput(t, cfg.Output, n)
			f.mu.Lock()
			answered := slices.Clone(f.answered)
			f.mu.Unlock()
			if slices.IsSorted(answered) {
				t.Fatalf("the fake completed in file order %v; the test proves nothing", answered)
			}
			if s.Lines != n || s.Completed != n || s.Rejected != 0 {
				t.Errorf("summary %+v", s)
			}
		})
	}
}

func TestReissueOnTimeout(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, func(ctx context.Context, _ runTaskBody, line, nth int) (int, string) {
		if line == 3 && nth == 1 {
			<-ctx.Done() // never answers the first attempt
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(6))
	cfg.WorkTimeout = 300 * time.Millisecond
	s := run(t, cfg)
	checkOutput(t, cfg.Output, 6)
	reqs := f.requests(3)
	if len(reqs) != 2 || reqs[0].TaskID != reqs[1].TaskID {
		t.Fatalf("line 3 was requested as %+v; want twice with one task id (the reissue attaches to the same run)", reqs)
	}
	if s.Reissued != 1 {
		t.Errorf("reissued %d, want 1", s.Reissued)
	}
}

func TestWorkTimeoutChangedWhileRunning(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, func(ctx context.Context, _ runTaskBody, line, nth int) (int, string) {
		if line == 2 && nth == 1 {
			<-ctx.Done()
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(5))
	cfg.WorkTimeout = time.Hour // the test would time out if the change did not apply to line 2
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ControlListener = ln
	base := "http://" + ln.Addr().String()
	wait := runAsync(t, cfg)

	waitFor(t, "line 2 to be in flight", func() bool { return len(f.requests(2)) == 1 })
	resp, err := noKeepAlive.Post(base+"/work-timeout", "application/json", strings.NewReader(`{"timeout": -1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a negative timeout got %d, want 400", resp.StatusCode)
	}
	resp, err = noKeepAlive.Post(base+"/work-timeout", "application/json", strings.NewReader(`{"timeout": 0.5}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /work-timeout: %d", resp.StatusCode)
	}
	var st Status
	resp, err = http.Get(base + "/status")
	if err != nil {
		t.Fatal(err)
	}
	_ = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if st.WorkTimeoutSecs != 0.5 || st.JobID == "" {
		t.Errorf("status after the change: %+v", st)
	}
	s := wait()
	checkOutput(t, cfg.Output, 5)
	if n := len(f.requests(2)); n != 2 || s.Reissued != 1 {
		t.Fatalf("line 2 requested %d times, %d reissued; want 2 and 1", n, s.Reissued)
	}
}

func TestRejectedAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, func(ctx context.Context, req runTaskBody, line, nth int) (int, string) {
		if line == 2 { // the dispatcher's failed answer: the task's view, kept under its id
			return http.StatusBadGateway, failedView(req, "worker error: out of memory")
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(4))
	cfg.MaxAttempts = 3
	s := run(t, cfg)
	checkOutput(t, cfg.Output, 4, 2)
	var ids []string
	for _, r := range f.requests(2) {
		ids = append(ids, r.TaskID)
	}
	if len(ids) != 3 || ids[0] == ids[1] || ids[1] == ids[2] {
		t.Fatalf("line 2's attempts used task ids %v; want 3 distinct ones (a failed answer is kept by the dispatcher)", ids)
	}
	rej := readLines(t, cfg.Output+".rejected.jsonl")
	if len(rej) != 1 {
		t.Fatalf("rejected file: %q", rej)
	}
	var r rejectedLine
	if err := json.Unmarshal([]byte(rej[0]), &r); err != nil || r.Line != 2 || !strings.Contains(r.Reason, "3 attempts") || !strings.Contains(r.Reason, "out of memory") || !strings.Contains(r.Input, `"n":2`) {
		t.Errorf("rejected line %q (%v)", rej[0], err)
	}
	if s.Rejected != 1 || s.Completed != 3 {
		t.Errorf("summary %+v", s)
	}
}

// A line that never gets an answer holds the window; reading stops at the window's
// bound instead of growing memory, and the line goes to the rejected file after its
// attempts, which lets the job finish.
func TestQueryOfDeathBoundedAndRejected(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, func(ctx context.Context, _ runTaskBody, line, _ int) (int, string) {
		if line == 1 {
			<-ctx.Done()
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(30))
	cfg.WorkTimeout, cfg.MaxAttempts, cfg.MaxOutOfOrder, cfg.Lookahead = 500*time.Millisecond, 2, 5, 5
	s := run(t, cfg)
	checkOutput(t, cfg.Output, 30, 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	lastLine1 := -1
	for i, r := range f.reqs {
		if lineOfID(r.TaskID) == 1 {
			lastLine1 = i
		}
	}
	// Until line 1's last attempt, nothing past the window (lines 1..5) may be issued.
	for _, r := range f.reqs[:lastLine1] {
		if l := lineOfID(r.TaskID); l > 5 {
			t.Fatalf("line %d was issued while line 1 held a window of 5", l)
		}
	}
	if s.Rejected != 1 || f.seen[1] != 2 {
		t.Errorf("line 1 requested %d times, %d rejected; want 2 and 1", f.seen[1], s.Rejected)
	}
}

func TestBadInputLinesGoToRejectedAndTheJobGoesOn(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, func(_ context.Context, req runTaskBody, _, _ int) (int, string) {
		if req.Label == "bad label" { // the dispatcher's own rule: a 400 is not retried
			return http.StatusBadRequest, `{"error":"label may hold only printable ASCII without spaces"}`
		}
		return http.StatusOK, ""
	})
	lines := taskLines(8)
	lines[1] = `this is not JSON`
	lines[3] = `{"task_type":"sample_task","parameters":{"n":4}}`
	lines[4] = `{"id":5,"label":"label-1","task_type":"sample_task","parameters":{"n":5,"pad":"` + strings.Repeat("x", 200) + `"}}`
	lines[6] = `{"id":7,"label":"bad label","task_type":"sample_task","parameters":{"n":7}}`
	cfg := setup(t, f, lines)
	cfg.MaxLineBytes = 150
	var bar syncBuffer
	cfg.Progress = &bar
	s := run(t, cfg)
	checkOutput(t, cfg.Output, 8, 2, 4, 5, 7)
	want := map[int64]string{2: "not a JSON object", 4: "missing label", 5: "limit is 150", 7: "dispatcher refused the task (400)"}
	rej := readLines(t, cfg.Output+".rejected.jsonl")
	if len(rej) != len(want) {
		t.Fatalf("rejected file has %d lines, want %d: %q", len(rej), len(want), rej)
	}
	for _, l := range rej {
		var r rejectedLine
		if err := json.Unmarshal([]byte(l), &r); err != nil || !strings.Contains(r.Reason, want[r.Line]) {
			t.Errorf("rejected line %q: want line with reason %q (%v)", l, want[r.Line], err)
		}
	}
	if len(f.requests(7)) != 1 {
		t.Errorf("a task the dispatcher refused with 400 was retried")
	}
	if s.Rejected != 4 || s.Completed != 4 {
		t.Errorf("summary %+v", s)
	}
	if !strings.Contains(bar.String(), "8/8") {
		t.Errorf("progress bar %q does not show 8/8", bar.String())
	}
}

// A file saved as "UTF-8 with BOM" (Notepad, PowerShell's Out-File, Excel's CSV-to-
// JSON exports) begins with EF BB BF. JSON allows a parser to ignore it (RFC 8259
// 8.1); the job rejected line 1, a good line, as "invalid character 'ï' looking for
// beginning of value", with the mark invisible in the rejected file's copy.
func TestByteOrderMarkBeforeLine1IsIgnored(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, nil)
	lines := taskLines(2)
	lines[0] = "\ufeff" + lines[0]
	cfg := setup(t, f, lines)
	s := run(t, cfg)
	checkOutput(t, cfg.Output, 2)
	if s.Completed != 2 || s.Rejected != 0 {
		t.Errorf("summary %+v", s)
	}
}

// syncBuffer is a bytes.Buffer safe for the progress bar's writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestLabelOrderGroupsSubmissions(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		order    Order
		switches int // most label changes between consecutive submissions
	}{
		{OrderFile, 23}, // a b c a b c ...: every submission changes label
		{OrderLabel, 5}, // at most: two windows of 12 lines, 3 labels each
	} {
		t.Run(string(tt.order), func(t *testing.T) {
			t.Parallel()
			f := newFakeDispatcher(t, nil)
			cfg := setup(t, f, taskLines(24, "a", "b", "c"))
			cfg.Concurrency, cfg.Order, cfg.Lookahead, cfg.MaxOutOfOrder, cfg.LabelsAtOnce = 1, tt.order, 12, 12, 1
			run(t, cfg)
			checkOutput(t, cfg.Output, 24)
			f.mu.Lock()
			defer f.mu.Unlock()
			switches := 0
			for i := 1; i < len(f.reqs); i++ {
				if f.reqs[i].Label != f.reqs[i-1].Label {
					switches++
				}
			}
			if switches > tt.switches || (tt.order == OrderFile && switches != tt.switches) {
				var labels []string
				for _, r := range f.reqs {
					labels = append(labels, r.Label)
				}
				t.Errorf("%d label switches in %v, want at most %d", switches, labels, tt.switches)
			}
		})
	}
}

func TestFreshJobRefusesExistingOutput(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, nil)
	cfg := setup(t, f, taskLines(2))
	if err := os.WriteFile(cfg.Output, []byte("{\"someone's\":\"results\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "no checkpoint") {
		t.Fatalf("Run over an existing output without a checkpoint: %v", err)
	}
	if b, _ := os.ReadFile(cfg.Output); string(b) != "{\"someone's\":\"results\"}\n" {
		t.Errorf("the existing output was changed: %q", b)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	cfg := Config{Input: "a", Output: "a", Order: "random", ControlAddr: "0.0.0.0:9000", Lookahead: 20, MaxOutOfOrder: 10, MaxWindowBytes: 1000, MaxLineBytes: 2000}.WithDefaults()
	err := cfg.Validate()
	for _, want := range []string{"four different files", "Order must be", "ControlAddr must be a loopback", "Lookahead (20) must not exceed MaxOutOfOrder (10)",
		"MaxWindowBytes (1000) must be at least MaxLineBytes (2000)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want a message containing %q", err, want)
		}
	}
}

// The dispatcher answers every task by its deadline plus its 5 s overrun grace (504
// past it): --task-timeout, 5m by default. The work timeout's default was the same 5m,
// so it expired first (it starts before the dispatcher's deadline does), counted an
// attempt, and the reissue attached to the run and got its 504, a second attempt for
// one deadline. The default must leave the dispatcher time to answer, with room for
// the request's way there and back and for the dispatcher's once-a-tick check.
func TestDefaultWorkTimeoutOutlastsTheDispatchersDeadline(t *testing.T) {
	t.Parallel()
	const dispatcherTaskTimeout = 5 * time.Minute // dispatcher --task-timeout's default
	const overrunGrace = 5 * time.Second          // dispatcher/hub.go's overrunGrace
	const room = 30 * time.Second
	if d := (Config{}).WithDefaults().WorkTimeout; d < dispatcherTaskTimeout+overrunGrace+room {
		t.Errorf("default work timeout %v: want at least %v, past the dispatcher's latest answer", d, dispatcherTaskTimeout+overrunGrace+room)
	}
}

// A bare 503 (the dispatcher shutting down, or a proxy in front while it restarts)
// refuses the task before it ran: the job pauses and sends it again under the same id,
// without counting an attempt. Only a task's failed answer moves it to a fresh id.
func TestRefusal503IsNotAFailedAttempt(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	total := 0
	f := newFakeDispatcher(t, func(_ context.Context, _ runTaskBody, _, _ int) (int, string) {
		mu.Lock()
		defer mu.Unlock()
		if total++; total <= 3 {
			return http.StatusServiceUnavailable, `{"error":"dispatcher is shutting down"}`
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(3))
	cfg.Concurrency, cfg.MaxAttempts = 1, 3
	s := run(t, cfg)
	checkOutput(t, cfg.Output, 3)
	if s.Rejected != 0 {
		t.Errorf("summary %+v: a line was rejected because the dispatcher was briefly unavailable", s)
	}
	for _, r := range f.requests(1) {
		if strings.Contains(r.TaskID, "-r") {
			t.Errorf("line 1 moved to fresh id %s after a refusal that ran nothing", r.TaskID)
		}
	}
}

// A proxy in front of the dispatcher (nginx, Traefik) answers 502 with a page of its
// own when it cannot reach the dispatcher: it is down or restarting, as "no answer" is
// without the proxy. The dispatcher's own 502 is a task's failed answer (its view,
// status "failed"). The job counted the proxy's as a failed attempt and issued the line
// again after the retry delay: a restart of a few seconds rejected every line it
// reached, the lines in flight and every line issued meanwhile. Now it pauses and keeps
// the id, as for a bare 503.
func TestProxy502IsNoAnswer(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	total := 0
	f := newFakeDispatcher(t, func(_ context.Context, _ runTaskBody, _, _ int) (int, string) {
		mu.Lock()
		defer mu.Unlock()
		if total++; total <= 3 { // the dispatcher restarting
			return http.StatusBadGateway, "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(3))
	cfg.Concurrency, cfg.MaxAttempts, cfg.Order = 1, 3, OrderFile
	s := run(t, cfg)
	checkOutput(t, cfg.Output, 3)
	if s.Rejected != 0 || s.Reissued != 0 {
		t.Errorf("summary %+v: the proxy's 502s while the dispatcher was away counted as the line's attempts", s)
	}
	reqs := f.requests(1)
	if len(reqs) != 4 {
		t.Fatalf("line 1 was submitted %d times, want 4 (three 502s, then its answer)", len(reqs))
	}
	for _, r := range reqs {
		if r.TaskID != reqs[0].TaskID {
			t.Errorf("line 1 was submitted as %s, first as %s: a 502 without the task's answer keeps the id", r.TaskID, reqs[0].TaskID)
		}
	}
}

// A proxy that passes every line but one, and answers that one a bare 502 each time
// (the dispatcher drops its connection on it: a query of death), paused submissions
// and sent the line again for ever, never an attempt: it held the window, and the run
// stalled on it. A line that gets nothing but such 502s for the work timeout counts an
// attempt, as a line unanswered that long does, and is rejected after MaxAttempts,
// under its one task id; the other lines complete.
func TestProxy502ForOneLineIsBoundedByTheWorkTimeout(t *testing.T) {
	t.Parallel()
	const nginx502 = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
	f := newFakeDispatcher(t, func(_ context.Context, _ runTaskBody, line, _ int) (int, string) {
		if line == 2 {
			return http.StatusBadGateway, nginx502
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(5))
	cfg.Concurrency, cfg.MaxAttempts, cfg.WorkTimeout = 2, 2, 300*time.Millisecond
	run(t, cfg)
	checkOutput(t, cfg.Output, 5, 2)
	rej := readLines(t, cfg.Output+".rejected.jsonl")
	if len(rej) != 1 || !strings.Contains(rej[0], "gave up after 2 attempts") || !strings.Contains(rej[0], "answered only 502") {
		t.Errorf("rejected file %q: want line 2, given up after 2 attempts of 502s", rej)
	}
	reqs := f.requests(2)
	if len(reqs) < 3 {
		t.Errorf("line 2 was submitted %d times: its 502s must pause and retry within an attempt, not count one each", len(reqs))
	}
	for _, r := range reqs {
		if r.TaskID != reqs[0].TaskID {
			t.Errorf("line 2 was submitted as %s, first as %s: a 502 without the task's answer keeps the id", r.TaskID, reqs[0].TaskID)
		}
	}
}

// The dispatcher's 429 says Retry-After: 1; the job waits that long, not its first
// 100 ms backoff.
func TestRetryAfterHonouredOn429(t *testing.T) {
	t.Parallel()
	f, times := attemptTimes(t, func(w http.ResponseWriter, req runTaskBody, nth int) {
		if nth == 0 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"error":"queue full: 10000 tasks waiting"}`))
			return
		}
		_, _ = w.Write([]byte(completed(req)))
	})
	cfg := setup(t, f, taskLines(1))
	cfg.Concurrency = 1
	run(t, cfg)
	checkOutput(t, cfg.Output, 1)
	at := times()
	if len(at) != 2 {
		t.Fatalf("%d requests, want 2", len(at))
	}
	if gap := at[1].Sub(at[0]); gap < time.Second {
		t.Errorf("resubmitted %v after a 429 with Retry-After: 1", gap)
	}
}

// attemptTimes serves /run-task with answer(nth), nth counting from 0, and records
// when each request came.
func attemptTimes(t *testing.T, answer func(w http.ResponseWriter, req runTaskBody, nth int)) (*fakeDispatcher, func() []time.Time) {
	var mu sync.Mutex
	var at []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req runTaskBody
		_ = json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		at = append(at, time.Now())
		nth := len(at) - 1
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		answer(w, req, nth)
	}))
	t.Cleanup(srv.Close)
	return &fakeDispatcher{srv: srv}, func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(at)
	}
}

// A label in the dispatcher's failing cool-down fails its tasks at once with 503 and
// the rest of the cool-down in Retry-After. The item waits that long instead of spending
// its attempts within milliseconds, and then completes.
func TestFailedAnswerWaitsOutRetryAfter(t *testing.T) {
	t.Parallel()
	f, times := attemptTimes(t, func(w http.ResponseWriter, req runTaskBody, nth int) {
		if nth == 0 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, `{"task_id":%q,"status":"failed","error":"label \"label-1\" is failing to load"}`, req.TaskID)
			return
		}
		_, _ = w.Write([]byte(completed(req)))
	})
	cfg := setup(t, f, taskLines(1))
	s := run(t, cfg)
	checkOutput(t, cfg.Output, 1)
	at := times()
	if len(at) != 2 {
		t.Fatalf("%d requests, want 2", len(at))
	}
	if gap := at[1].Sub(at[0]); gap < time.Second {
		t.Errorf("issued again %v after a failed answer with Retry-After: 1", gap)
	}
	if s.Reissued != 1 || s.Completed != 1 {
		t.Errorf("summary %+v", s)
	}
}

// Without a Retry-After, the wait after each failed answer starts at RetryDelay and
// doubles.
func TestFailedAnswersBackOff(t *testing.T) {
	t.Parallel()
	f, times := attemptTimes(t, func(w http.ResponseWriter, req runTaskBody, _ int) {
		w.WriteHeader(http.StatusBadGateway)
		_, _ = fmt.Fprintf(w, `{"task_id":%q,"status":"failed","error":"worker error: out of memory"}`, req.TaskID)
	})
	cfg := setup(t, f, taskLines(1))
	cfg.RetryDelay = 100 * time.Millisecond
	s := run(t, cfg)
	at := times()
	if len(at) != 3 || s.Rejected != 1 {
		t.Fatalf("%d requests, summary %+v; want 3 and the line rejected", len(at), s)
	}
	if g1, g2 := at[1].Sub(at[0]), at[2].Sub(at[1]); g1 < 100*time.Millisecond || g2 < 200*time.Millisecond {
		t.Errorf("waits between attempts %v, %v; want at least 100ms, then 200ms", g1, g2)
	}
}

func TestRetryAfterHeader(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		v    string
		want time.Duration
	}{
		{"", 0}, {"2", 2 * time.Second}, {" 3 ", 3 * time.Second}, {"-4", 0}, {"soon", 0},
		{"86400", 5 * time.Minute},
		// Bounded before seconds become a Duration: the product overflowed to 0 or less.
		{"10000000000", 5 * time.Minute}, {"18446744074", 5 * time.Minute},
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0},
	} {
		if got := retryAfter(c.v, now); got != c.want {
			t.Errorf("retryAfter(%q) = %v, want %v", c.v, got, c.want)
		}
	}
}

// A 404 on POST /run-task means --dispatcher is not the dispatcher's URL: the job stops
// with that error instead of rejecting every line and checkpointing past them.
func TestRunTask404StopsTheJob(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, func(_ context.Context, _ runTaskBody, _, _ int) (int, string) {
		return http.StatusNotFound, `{"message":"Not Found"}`
	})
	cfg := setup(t, f, taskLines(20))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Run(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), "--dispatcher") {
		t.Errorf("Run over a URL answering 404: err %v, want an error naming the 404 and --dispatcher", err)
	}
	if s.Rejected > 0 {
		t.Errorf("%d lines rejected for the job's wrong URL", s.Rejected)
	}
	if cp, _, _ := loadCheckpoint(cfg.Output + ".checkpoint"); cp.Lines != 0 {
		t.Errorf("checkpoint %+v advanced past lines that never ran", cp)
	}
}

// A --dispatcher whose certificate the job does not trust, or whose host does not
// resolve, fails every request the same way however often it is sent. Both were taken
// for "no answer" (a dispatcher restarting) and paused and retried for ever: the run
// hung after one warning. They stop the job at once, naming the URL and the cause.
func TestUnreachableDispatcherStopsTheJob(t *testing.T) {
	t.Parallel()
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("a request reached the server past a certificate the job does not trust")
	}))
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	plainSrv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("a TLS handshake was taken for a request")
	}))
	t.Cleanup(plainSrv.Close)
	for _, tt := range []struct {
		name, url string
		cause     string
	}{
		{"untrusted certificate", tlsSrv.URL, "x509: certificate signed by unknown authority"},
		{"https to a plain-HTTP server", "https://" + strings.TrimPrefix(plainSrv.URL, "http://"), "does not speak TLS"},
		// .invalid never resolves (RFC 6761).
		{"unknown host", "http://dispatcher.invalid:8080", "no such host"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if strings.HasSuffix(tt.name, "host") {
				var dnsErr *net.DNSError
				if _, err := net.DefaultResolver.LookupHost(context.Background(), "dispatcher.invalid"); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
					t.Skipf("no resolver here says .invalid does not exist: %v", err)
				}
			}
			cfg := setup(t, &fakeDispatcher{srv: tlsSrv}, taskLines(20))
			cfg.DispatcherURL = tt.url
			s, err := runBounded(cfg)
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Run: %v, want it stopped by the first answerless request", err)
			}
			for _, want := range []string{tt.url + "/run-task", tt.cause, "--dispatcher"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Run: %v; want %q in it", err, want)
				}
			}
			if s.Rejected > 0 || s.Reissued > 0 {
				t.Errorf("summary %+v: lines were charged for the job's URL", s)
			}
			if cp, _, _ := loadCheckpoint(cfg.Output + ".checkpoint"); cp.Lines != 0 {
				t.Errorf("checkpoint %+v advanced past lines that never ran", cp)
			}
		})
	}
}

// Connections refused or reset are what a dispatcher restarting gives: the job pauses
// and sends the line again under its id, no attempt counted, until it answers. So
// does a host that stops resolving once the dispatcher has answered ("unresolved"): a
// Service being recreated, not a wrong URL.
func TestDroppedConnectionsPauseAndRetry(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"refused", "reset", "unresolved"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			var drops atomic.Int32
			f := newFakeDispatcher(t, nil)
			if how == "reset" {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if drops.Add(1) <= 3 {
						c, _, err := http.NewResponseController(w).Hijack()
						if err != nil {
							t.Error(err)
							return
						}
						_ = c.(*net.TCPConn).SetLinger(0) // close with a reset
						c.Close()
						return
					}
					var req runTaskBody
					_ = json.NewDecoder(r.Body).Decode(&req)
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write([]byte(completed(req)))
				}))
				t.Cleanup(srv.Close)
				f = &fakeDispatcher{srv: srv}
			}
			// A socket file whose listener is closed refuses connections, and no other
			// test can take it as one could a TCP port.
			sock := filepath.Join(t.TempDir(), "closed.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			ln.(*net.UnixListener).SetUnlinkOnClose(false)
			ln.Close()
			var d net.Dialer
			tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				switch {
				case how == "refused" && drops.Add(1) <= 3:
					return d.DialContext(ctx, "unix", sock)
				case how == "unresolved":
					if n := drops.Add(1); n >= 2 && n <= 4 { // after the first line's answer
						return nil, &net.DNSError{Err: "no such host", Name: "dispatcher.example", IsNotFound: true}
					}
				}
				return d.DialContext(ctx, network, addr)
			}}
			tr.DisableKeepAlives = how == "unresolved" // every request dials, and so resolves
			t.Cleanup(tr.CloseIdleConnections)
			cfg := setup(t, f, taskLines(3))
			cfg.Concurrency, cfg.Order, cfg.HTTPClient = 1, OrderFile, &http.Client{Transport: tr}
			s := run(t, cfg)
			checkOutput(t, cfg.Output, 3)
			if s.Rejected != 0 || s.Reissued != 0 {
				t.Errorf("summary %+v: connections %s while the dispatcher was away counted as attempts", s, how)
			}
			if drops.Load() <= 3 {
				t.Errorf("%d connections, want the three %s ones and then answers", drops.Load(), how)
			}
		})
	}
}

// Run closes the keep-alive connections of the client it made: a process that embeds
// it (the benchmark's batch comparison) keeps no sockets or goroutines per job.
func TestRunLeavesNoConnectionsOpen(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req runTaskBody
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(completed(req)))
	}))
	srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch st {
		case http.StateNew:
			open[c] = true
		case http.StateClosed, http.StateHijacked:
			delete(open, c)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	cfg := setup(t, &fakeDispatcher{srv: srv}, taskLines(40))
	cfg.Concurrency = 8
	run(t, cfg)
	checkOutput(t, cfg.Output, 40)
	waitFor(t, "the finished job's connections to close", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(open) == 0
	})
}

// README's command, curl -d, sends the JSON body as application/x-www-form-urlencoded;
// so do other clients that set no type. The body is JSON whatever the header says.
func TestWorkTimeoutAcceptsCurlDefaultContentType(t *testing.T) {
	t.Parallel()
	j, ln := controlledJob(t)
	for _, ct := range []string{"application/x-www-form-urlencoded", "text/plain"} {
		resp, err := noKeepAlive.Post("http://"+ln.Addr().String()+"/work-timeout", ct, strings.NewReader(`{"timeout": 1600}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || time.Duration(j.timeout.Load()) != 1600*time.Second {
			t.Errorf("Content-Type %s: status %d, work timeout %v; want 200 and 1600s", ct, resp.StatusCode, time.Duration(j.timeout.Load()))
		}
		j.timeout.Store(int64(time.Minute))
	}
}

// A dispatcher with a journal that shuts down answers the producers waiting on
// journaled tasks 503 with the task's view, still queued or running: the task is
// kept and runs after the restart (hub.releaseLocked). That is not a failed answer:
// the item keeps its task id, so its resubmission attaches to the journaled run
// instead of running a second copy, and it spends no attempt.
func TestShutdown503ForAJournaledTaskKeepsTheTaskID(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, func(_ context.Context, req runTaskBody, line, nth int) (int, string) {
		if line == 2 && nth == 1 {
			return http.StatusServiceUnavailable, fmt.Sprintf(`{"task_id":%q,"status":"running","label":%q,"task_type":"sample_task","worker_id":"w1","label_miss":false,"attempts":1,"queue_ms":0,"load_ms":0,"run_ms":0,"error":"dispatcher shutting down; task %s is journaled and runs when the dispatcher starts again"}`,
				req.TaskID, req.Label, req.TaskID)
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(3))
	cfg.MaxAttempts = 1 // a counted attempt would reject line 2
	s := run(t, cfg)
	checkOutput(t, cfg.Output, 3)
	reqs := f.requests(2)
	if len(reqs) != 2 || reqs[1].TaskID != reqs[0].TaskID {
		t.Errorf("line 2 was submitted as %v; want twice under one id", reqs)
	}
	if s.Rejected != 0 || s.Reissued != 0 {
		t.Errorf("summary %+v: the shutdown's 503 counted as a failed attempt", s)
	}
}

// Run again with the same command on a different input (a daily job's new file, the
// old output and checkpoint left in place), the job must not seek the new file to the
// old offset and append its lines, misnumbered and cut mid-line, to the old output.
func TestResumeRefusesAnotherInput(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, nil)
	cfg := setup(t, f, taskLines(3))
	run(t, cfg)
	before, err := os.ReadFile(cfg.Output)
	if err != nil {
		t.Fatal(err)
	}
	other := taskLines(8, "label-9")
	for i := range other {
		other[i] = strings.Replace(other[i], `"sample_task"`, `"other_task"`, 1)
	}
	if err := os.WriteFile(cfg.Input, []byte(strings.Join(other, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "not the input") {
		t.Errorf("Run on another input with the old checkpoint: %v; want a refusal", err)
	}
	if after, _ := os.ReadFile(cfg.Output); string(after) != string(before) {
		t.Errorf("the output changed:\n%s", after)
	}
}

// A fresh job whose input cannot be opened changes nothing: no checkpoint is left
// behind to be taken for a job later.
func TestFreshJobWithoutInputLeavesNoCheckpoint(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, nil)
	cfg := setup(t, f, taskLines(1))
	cfg.Input += ".typo"
	if _, err := Run(context.Background(), cfg); err == nil {
		t.Fatal("Run with a missing input succeeded")
	}
	for _, p := range []string{cfg.Output, cfg.Output + ".checkpoint", cfg.Output + ".rejected.jsonl"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s was created", p)
		}
	}
}

// A second run of the same job while the first still runs (a cron job overlapping
// the last one, a second operator) would cut the output back to the checkpoint under
// the first one's feet and interleave their lines. It is refused and changes nothing.
func TestSecondRunOfARunningJobIsRefused(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	// The second run, when it is not refused, is stopped once it submits anything.
	secondCtx, stopSecond := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopSecond()
	f := newFakeDispatcher(t, func(ctx context.Context, _ runTaskBody, line, nth int) (int, string) {
		if nth > 1 { // the first run submits each line once
			stopSecond()
		}
		if line == 3 {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(5))
	wait := runAsync(t, cfg)
	waitFor(t, "the first run to checkpoint lines 1 and 2", func() bool {
		cp, ok, _ := loadCheckpoint(cfg.Output + ".checkpoint")
		return ok && cp.Lines == 2
	})
	before, err := os.ReadFile(cfg.Output)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(secondCtx, cfg)
	if err == nil || !strings.Contains(err.Error(), "another batch job") {
		t.Errorf("a second run while the first runs: %v; want a refusal", err)
	}
	if after, _ := os.ReadFile(cfg.Output); string(after) != string(before) {
		t.Errorf("the second run changed the output:\n%s", after)
	}
	close(release)
	wait()
	checkOutput(t, cfg.Output, 5)
	if n := len(f.requests(4)); n != 1 {
		t.Errorf("line 4 was submitted %d times; the second run must submit nothing", n)
	}
}

// Two fresh runs of one job started together (a cron job fired twice): the lock was
// taken only after the checkpoint was read and a fresh one written, so a second run
// read, or wrote, the checkpoint while the first was opening: both could write one, the
// second's job id over the first's, or the second took the first's fresh checkpoint for
// a job to resume. Here the first is held just after writing its checkpoint; the second
// must be refused by the lock without touching it.
func TestSecondFreshRunWhileTheFirstOpensIsRefused(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, nil)
	cfg := setup(t, f, taskLines(5))
	first := cfg
	written, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	first.syncDir = func(dir string) error {
		// The first directory sync is the fresh checkpoint's, after its rename.
		once.Do(func() {
			close(written)
			<-release
		})
		return syncDir(dir)
	}
	wait := runAsync(t, first)
	<-written
	before, err := os.ReadFile(cfg.Output + ".checkpoint")
	if err != nil {
		t.Fatal(err)
	}
	secondCtx, stopSecond := context.WithCancel(context.Background())
	defer stopSecond()
	go func() { // a second run that was not refused is stopped once it submits a line
		<-f.arrivedCh
		stopSecond()
	}()
	_, err = Run(secondCtx, cfg)
	if err == nil || !strings.Contains(err.Error(), "in use by another batch job") {
		t.Errorf("a second fresh run while the first opens: %v; want it refused by the lock", err)
	}
	if after, _ := os.ReadFile(cfg.Output + ".checkpoint"); string(after) != string(before) {
		t.Errorf("the second run changed the first's checkpoint:\n%s\nwas\n%s", after, before)
	}
	close(release)
	s := wait()
	checkOutput(t, cfg.Output, 5)
	if cp, _, _ := loadCheckpoint(cfg.Output + ".checkpoint"); cp.JobID != s.JobID || cp.Lines != 5 {
		t.Errorf("checkpoint %+v after the first run (job %s) ended", cp, s.JobID)
	}
}

// A gateway in front of the dispatcher that sends unauthenticated requests to its
// sign-in page (302, followed by the client, then 200 HTML) answers 200 without a
// task's answer. Taking that for a completed task wrote every line as completed with
// no result and checkpointed it: the whole input lost, exit 0. The job stops instead.
func TestA200ThatIsNotATaskAnswerStopsTheJob(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/run-task" {
			http.Redirect(w, r, "/sign-in", http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte("<html><body>Sign in</body></html>"))
	}))
	defer srv.Close()
	cfg := setup(t, &fakeDispatcher{srv: srv}, taskLines(5))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Run(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "not a task's answer") {
		t.Errorf("Run against a sign-in page: %v; want an error", err)
	}
	if s.Completed != 0 {
		t.Errorf("%d lines written as completed from a sign-in page", s.Completed)
	}
	if cp, _, _ := loadCheckpoint(cfg.Output + ".checkpoint"); cp.Lines != 0 {
		t.Errorf("checkpoint %+v advanced past lines that never ran", cp)
	}
}

// A 200 whose fields are of other types is not the dispatcher's answer either: it was
// read in part, and each line written as completed with "label_miss" false (or no
// worker) whatever the body said.
func TestA200WithAFieldOfAnotherTypeStopsTheJob(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"status":"completed","worker_id":"w1","label_miss":"yes","result":{}}`,
		`{"status":"completed","worker_id":7,"label_miss":true,"result":{}}`,
	} {
		f := newFakeDispatcher(t, func(context.Context, runTaskBody, int, int) (int, string) { return http.StatusOK, body })
		cfg := setup(t, f, taskLines(3))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := Run(ctx, cfg)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "not a task's answer (json: cannot unmarshal") {
			t.Errorf("%s: %v; want an error", body, err)
		}
		if s.Completed != 0 {
			t.Errorf("%s: %d lines written as completed", body, s.Completed)
		}
	}
}

// The output and rejected files are created by the job, and a new file's name is
// durable only once its directory is fsynced: without that, a power cut could leave
// a checkpoint counting bytes of a file that is gone. Each file's directory (here three
// different ones) is synced after the file exists and before any checkpoint counts a
// line.
func TestCreatedFilesDirectoriesAreSynced(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, nil)
	lines := taskLines(5)
	lines[2] = "not json" // so the rejected file gets bytes too
	cfg := setup(t, f, lines)
	dirs := map[string]string{}
	for _, name := range []string{"output", "rejected", "checkpoint"} {
		dirs[name] = filepath.Join(t.TempDir(), name)
		if err := os.Mkdir(dirs[name], 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Output = filepath.Join(dirs["output"], "out.jsonl")
	cfg.Rejected = filepath.Join(dirs["rejected"], "rejected.jsonl")
	cfg.Checkpoint = filepath.Join(dirs["checkpoint"], "cp.json")
	type syncCall struct {
		dir     string
		exists  bool  // the file the job keeps in dir existed
		cpLines int64 // lines the checkpoint counted
	}
	file := map[string]string{dirs["output"]: cfg.Output, dirs["rejected"]: cfg.Rejected, dirs["checkpoint"]: cfg.Checkpoint}
	var mu sync.Mutex
	var calls []syncCall
	cfg.syncDir = func(dir string) error {
		_, err := os.Stat(file[dir])
		cp, _, _ := loadCheckpoint(cfg.Checkpoint)
		mu.Lock()
		calls = append(calls, syncCall{dir, err == nil, cp.Lines})
		mu.Unlock()
		return syncDir(dir)
	}
	run(t, cfg)
	checkOutput(t, cfg.Output, 5, 3)
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"output", "rejected", "checkpoint"} {
		if !slices.ContainsFunc(calls, func(c syncCall) bool { return c.dir == dirs[name] && c.exists && c.cpLines == 0 }) {
			t.Errorf("the %s file's directory was not fsynced after the file was created and before a checkpoint counted its lines; directory fsyncs: %+v", name, calls)
		}
	}
}

// failedView is the dispatcher's failed answer: the task's view, which it keeps under
// the task id.
func failedView(req runTaskBody, msg string) string {
	b, _ := json.Marshal(map[string]any{"task_id": req.TaskID, "status": "failed", "label": req.Label, "task_type": req.TaskType, "attempts": 1, "error": msg})
	return string(b)
}

// A synchronous /run-task 504 comes in two forms. The dispatcher's own is a failed
// task: its deadline passed while queued, its worker reported it past its deadline, or
// its worker overran the deadline by 5 s without reporting (the dispatcher cancels that
// attempt). The answer is its view, status "failed", kept under the id, so the item
// runs again under a fresh id. A bare {"error"} (a proxy's 504 while the dispatcher
// holds the task, or an older dispatcher's "still running" for an overrun run) keeps
// nothing, and the run may go on: a fresh id would run it a second time and lose the
// first run's result. The item is issued again under the same id, which attaches to
// that run (here: gets its answer). Both are issued again only after the retry delay.
func TestSync504KeepsTheTaskIDWhileTheRunGoesOn(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		answer func(req runTaskBody) string
		sameID bool
	}{
		{"older dispatcher, still running", func(req runTaskBody) string {
			return `{"error":"deadline exceeded; task ` + req.TaskID + ` is still running"}`
		}, true},
		{"failed while queued", func(req runTaskBody) string { return failedView(req, "deadline exceeded while queued") }, false},
		{"failed, worker overran", func(req runTaskBody) string {
			return failedView(req, `deadline exceeded: worker "w1" overran it by 5s and did not answer; its attempt was cancelled`)
		}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var ids []string
			f, times := attemptTimes(t, func(w http.ResponseWriter, req runTaskBody, nth int) {
				mu.Lock()
				ids = append(ids, req.TaskID)
				mu.Unlock()
				if nth == 0 {
					w.WriteHeader(http.StatusGatewayTimeout)
					_, _ = w.Write([]byte(tt.answer(req)))
					return
				}
				_, _ = w.Write([]byte(completed(req)))
			})
			cfg := setup(t, f, taskLines(1))
			cfg.RetryDelay = 100 * time.Millisecond
			s := run(t, cfg)
			checkOutput(t, cfg.Output, 1)
			at := times()
			mu.Lock()
			defer mu.Unlock()
			if len(ids) != 2 {
				t.Fatalf("task ids %v, want two requests", ids)
			}
			if same := ids[0] == ids[1]; same != tt.sameID {
				t.Errorf("after the 504 the line was issued as %s, first as %s; want the same id: %v", ids[1], ids[0], tt.sameID)
			}
			if gap := at[1].Sub(at[0]); gap < cfg.RetryDelay {
				t.Errorf("issued again %v after the 504, want at least the retry delay %v", gap, cfg.RetryDelay)
			}
			if s.Completed != 1 || s.Reissued != 1 {
				t.Errorf("summary %+v", s)
			}
		})
	}
}

// An older dispatcher's run that stays past its deadline answers 504 "still running" to
// every attach: the item spends its attempts, all under the one id, and is rejected
// with the reason.
func TestSync504ForARunThatNeverEndsIsRejected(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, func(_ context.Context, req runTaskBody, line, _ int) (int, string) {
		if line == 2 {
			return http.StatusGatewayTimeout, `{"error":"deadline exceeded; task ` + req.TaskID + ` is still running"}`
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(3))
	cfg.MaxAttempts = 3
	s := run(t, cfg)
	checkOutput(t, cfg.Output, 3, 2)
	reqs := f.requests(2)
	if len(reqs) != 3 || reqs[1].TaskID != reqs[0].TaskID || reqs[2].TaskID != reqs[0].TaskID {
		t.Errorf("line 2 was submitted as %v; want three times under one id", reqs)
	}
	rej := readLines(t, cfg.Output+".rejected.jsonl")
	if len(rej) != 1 || !strings.Contains(rej[0], "3 attempts") || !strings.Contains(rej[0], "still running") {
		t.Errorf("rejected file: %q", rej)
	}
	if s.Rejected != 1 || s.Completed != 2 {
		t.Errorf("summary %+v", s)
	}
}

// The dispatcher answers 409 to an id it holds (in flight, or answered within
// --task-retention) for a task with another label, type or parameters: the job sent
// the line under that id before, and the input changed since past the bytes a resume
// checks (a line edited or inserted after the job was stopped). Neither that task's
// answer nor the id will ever be this line's, so the line moves to a fresh id at once;
// before, it was sent under the same id --max-attempts times, waiting the retry delay
// between (1 s, 2 s by default), and rejected.
func TestConflict409MovesTheLineToAFreshID(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, func(_ context.Context, req runTaskBody, line, _ int) (int, string) {
		if line == 2 && strings.HasSuffix(req.TaskID, "-2") {
			return http.StatusConflict, `{"error":"task id ` + req.TaskID + ` was used for a different task (label/type/parameters differ) within the last --task-retention; use a new id"}`
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(3))
	s := run(t, cfg)
	checkOutput(t, cfg.Output, 3)
	reqs := f.requests(2)
	if len(reqs) != 2 || !strings.HasSuffix(reqs[1].TaskID, "-2-r1") {
		t.Errorf("line 2 was submitted as %v; want its id, then a fresh one (-2-r1)", reqs)
	}
	if s.Completed != 3 || s.Rejected != 0 {
		t.Errorf("summary %+v", s)
	}
}

// MaxOutOfOrder counts lines, and a line can be large: an input line up to
// MaxLineBytes (held twice, as read and as its parameters) until it is answered, an
// answer of any size until the lines before it are written. The window is bounded in
// bytes too. Big inputs: reading stops at the bound instead of filling the look-ahead.
// Big answers behind a line that does not come back: issuing stops (but for that
// line) instead of piling up the window's worth of answers.
func TestWindowBoundedInBytes(t *testing.T) {
	t.Parallel()
	const bound, big = 256 << 10, 16 << 10
	t.Run("big inputs", func(t *testing.T) {
		t.Parallel()
		f := newFakeDispatcher(t, nil)
		lines := make([]string, 100)
		for i := range lines {
			lines[i] = fmt.Sprintf(`{"label":"a","task_type":"sample_task","parameters":{"n":%d,"pad":%q}}`, i+1, strings.Repeat("x", big))
		}
		cfg := setup(t, f, lines)
		cfg.MaxWindowBytes, cfg.MaxOutOfOrder, cfg.Lookahead, cfg.MaxLineBytes = bound, 100, 50, 2*big
		s := run(t, cfg)
		checkOutput(t, cfg.Output, len(lines))
		// Reading stops at the bound; the line that crosses it is the last one read.
		if limit := int64(bound + 2*big + 1024); s.PeakWindowBytes > limit || s.PeakWindowBytes < bound {
			t.Errorf("the window held up to %d bytes; want between the bound %d and %d", s.PeakWindowBytes, bound, limit)
		}
	})
	t.Run("big answers", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		f := newFakeDispatcher(t, func(ctx context.Context, req runTaskBody, line, _ int) (int, string) {
			if line == 1 {
				select { // holds the window until the job has done all it will without it
				case <-release:
				case <-ctx.Done():
				}
			}
			b, _ := json.Marshal(map[string]any{"task_id": req.TaskID, "status": "completed", "worker_id": "w1",
				"result": map[string]any{"echo": req.ParametersJSON, "pad": strings.Repeat("y", big)}})
			return http.StatusOK, string(b)
		})
		cfg := setup(t, f, taskLines(150))
		cfg.MaxWindowBytes, cfg.MaxOutOfOrder, cfg.MaxLineBytes = bound, 100, 1024
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg.ControlListener = ln
		wait := runAsync(t, cfg)
		// Quiet: only line 1 in flight, and nothing more to issue without it (the
		// window full, in bytes or, without the bound, in lines).
		waitFor(t, "the job to issue all it will while line 1 holds the window", func() bool {
			resp, err := http.Get("http://" + ln.Addr().String() + "/status")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var st Status
			return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Issued > 1 && st.InFlight == 1
		})
		f.mu.Lock()
		issued := len(f.reqs)
		f.mu.Unlock()
		close(release)
		s := wait()
		checkOutput(t, cfg.Output, 150)
		// Answers of lines in flight when the bound is reached still come in.
		if limit := int64(bound + cfg.Concurrency*(big+1024)); s.PeakWindowBytes > limit {
			t.Errorf("the window held up to %d bytes (%d lines issued while line 1 held it); want at most %d", s.PeakWindowBytes, issued, limit)
		}
	})
}

// A written line's answer is let go: MaxWindowBytes bounds the memory of the whole
// job, not only of the lines waiting. The look-ahead pool's slices, cut at the front,
// kept their written items, and with them every answer since they last grew: here
// 10 MiB of answers under a 256 KiB bound. Not parallel: it measures the heap.
func TestWrittenAnswersAreLetGo(t *testing.T) {
	for _, order := range []Order{OrderLabel, OrderFile} {
		t.Run(string(order), func(t *testing.T) {
			const lines, big = 300, 32 << 10
			release := make(chan struct{})
			f := newFakeDispatcher(t, func(ctx context.Context, req runTaskBody, line, _ int) (int, string) {
				if line == lines {
					select { // the job runs on, every other line written
					case <-release:
					case <-ctx.Done():
					}
				}
				b, _ := json.Marshal(map[string]any{"task_id": req.TaskID, "status": "completed", "worker_id": "w1",
					"result": map[string]any{"echo": req.ParametersJSON, "pad": strings.Repeat("y", big)}})
				return http.StatusOK, string(b)
			})
			cfg := setup(t, f, taskLines(lines))
			cfg.Order = order
			cfg.MaxWindowBytes, cfg.MaxLineBytes = 256<<10, 1024
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			cfg.ControlListener = ln
			before := liveHeap()
			wait := runAsync(t, cfg)
			waitFor(t, "every line but the last to be written", func() bool {
				resp, err := noKeepAlive.Get("http://" + ln.Addr().String() + "/status")
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				var st Status
				return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Lines == lines-1
			})
			held := liveHeap() - before
			close(release)
			wait()
			checkOutput(t, cfg.Output, lines)
			// The window's bound, the answers in flight and the files' buffers, with room.
			if limit := int64(4*cfg.MaxWindowBytes + 2<<20); held > limit {
				t.Errorf("with %d lines written (%d KiB answers) the job holds %d KiB; want at most %d KiB (--max-window-bytes %d KiB)",
					lines-1, big>>10, held>>10, limit>>10, cfg.MaxWindowBytes>>10)
			}
		})
	}
}

// liveHeap is the heap's size after a full collection.
func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// A job stopped while line 1 is still in flight has line 2's answer but cannot write
// it (output keeps input order): its summary counts only the lines it wrote, and the
// resume, which runs line 2 again, counts it once. Before, line 2 was counted by both.
func TestInterruptedSummaryCountsOnlyWrittenLines(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, func(ctx context.Context, _ runTaskBody, line, nth int) (int, string) {
		if line == 1 && nth == 1 {
			<-ctx.Done() // in flight until the job stops
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(2))
	cfg.Order = OrderFile
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ControlListener = ln
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		s   Summary
		err error
	}
	done := make(chan result, 1)
	go func() { s, err := Run(ctx, cfg); done <- result{s, err} }()
	waitFor(t, "line 2's answer to be taken while line 1 runs", func() bool {
		resp, err := noKeepAlive.Get("http://" + ln.Addr().String() + "/status")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var st Status
		_ = json.NewDecoder(resp.Body).Decode(&st)
		return st.Issued == 2 && st.InFlight == 1
	})
	cancel()
	first := <-done
	if first.err == nil || !strings.Contains(first.err.Error(), "canceled") {
		t.Fatalf("first run: %v", first.err)
	}
	if s := first.s; s.Lines != 0 || s.Completed+s.Rejected != s.Lines || s.LabelMisses != 0 {
		t.Errorf("interrupted run's summary: %d lines written, %d completed, %d rejected, %d misses", s.Lines, s.Completed, s.Rejected, s.LabelMisses)
	}
	cfg.ControlListener = nil
	second := run(t, cfg)
	checkOutput(t, cfg.Output, 2)
	if got := first.s.Completed + second.Completed; got != 2 {
		t.Errorf("the two runs report %d completed lines for a 2-line input", got)
	}
}

// A resume names the files the checkpoint was written for: with another --rejected it
// cut that file back to the checkpoint's RejectedSize, destroying an unrelated file.
func TestResumeWithAnotherRejectedFileIsRefused(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, nil)
	cfg := setup(t, f, taskLines(3))
	run(t, cfg) // done; nothing rejected, so the checkpoint's RejectedSize is 0

	other := filepath.Join(filepath.Dir(cfg.Output), "errors.log")
	const keep = "another job's rejected lines\n"
	if err := os.WriteFile(other, []byte(keep), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Rejected = other
	_, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "--rejected") {
		t.Errorf("resume with another --rejected: %v, want it refused naming --rejected", err)
	}
	if b, _ := os.ReadFile(other); string(b) != keep {
		t.Errorf("resume with --rejected %s changed that file to %q", other, b)
	}
}

// A resume reads lines as the job it resumes did: with another label field it sent
// the same line as another task under the same task id, which the dispatcher answers
// with the first run's task (in flight, or its kept answer).
func TestResumeWithAnotherLabelFieldIsRefused(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	f := newFakeDispatcher(t, func(ctx context.Context, _ runTaskBody, line, nth int) (int, string) {
		if line == 1 && nth == 1 {
			select { // in flight when the first run is interrupted
			case <-release:
			case <-ctx.Done():
			}
		}
		return http.StatusOK, ""
	})
	lines := []string{`{"id":1,"label":"label-a","model":"label-b","task_type":"sample_task","parameters":{"n":1}}`}
	cfg := setup(t, f, lines)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := Run(ctx, cfg); done <- err }()
	select {
	case <-f.arrivedCh:
	case <-time.After(20 * time.Second):
		t.Fatal("line 1 not issued")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("first run: %v", err)
	}
	close(release)

	cfg.Fields.Label = "model"
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	_, err := Run(ctx2, cfg)
	if err == nil || !strings.Contains(err.Error(), `--label-field "model" (was "label")`) {
		t.Errorf("resume with another --label-field: %v, want it refused naming the setting", err)
	}
	if reqs := f.requests(1); len(reqs) != 1 {
		t.Errorf("line 1 sent %d times, want once (by the first run only)", len(reqs))
	}
}

// An interrupted job (or one stopped by an error) ended its progress bar with Finish,
// which fills the bar: the operator saw 5/5 (100%) for a job that wrote one line of five.
func TestInterruptedProgressBarShowsWhatWasWritten(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, answerFirstLineOnly)
	cfg := setup(t, f, taskLines(5))
	cfg.Order, cfg.Concurrency = OrderFile, 1
	var bar syncBuffer
	cfg.Progress = &bar
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := Run(ctx, cfg); done <- err }()
	<-f.answeredCh // line 1 answered
	<-f.arrivedCh
	<-f.arrivedCh // line 2 issued: line 1's answer was taken and written
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	cp, _, _ := loadCheckpoint(cfg.Output + ".checkpoint")
	if out := bar.String(); strings.Contains(out, "5/5") || strings.Contains(out, "100%") {
		t.Errorf("interrupted after %d of 5 lines, the progress bar ends with %q", cp.Lines, out[max(0, len(out)-120):])
	}
}

// A failed fsync of the output is sticky: no later checkpoint may count its lines. On
// Linux a second fsync after a writeback error usually succeeds, the dirty pages gone:
// the stop's checkpoint then recorded lines a power cut could have lost.
func TestFailedSyncBlocksEveryLaterCheckpoint(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, answerFirstLineOnly)
	cfg := setup(t, f, taskLines(3))
	cfg.Order, cfg.Concurrency, cfg.CheckpointInterval = OrderFile, 1, 5*time.Millisecond
	var syncs atomic.Int32
	cfg.syncFile = func(f *os.File) error {
		if syncs.Add(1) == 1 {
			return errors.New("input/output error")
		}
		return f.Sync()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("Run = %v, want the fsync's error", err)
	}
	if cp, _, _ := loadCheckpoint(cfg.Output + ".checkpoint"); cp.Lines != 0 {
		t.Errorf("after a failed fsync the checkpoint counts %d lines, want none (only the fresh job's)", cp.Lines)
	}
}

// An answer over the bound the job reads (a huge result) rejects its line and the job
// goes on: read in part it failed to parse, and a 200 that is no task's answer stopped
// the whole job.
func TestAnswerTooLargeRejectsItsLine(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, func(_ context.Context, req runTaskBody, line, _ int) (int, string) {
		if line == 2 {
			return http.StatusOK, `{"task_id":"` + req.TaskID + `","status":"completed","result":"` + strings.Repeat("x", 4096) + `"}`
		}
		return http.StatusOK, ""
	})
	cfg := setup(t, f, taskLines(3))
	cfg.maxAnswerBytes = 2048
	s := run(t, cfg)
	if s.Completed != 2 || s.Rejected != 1 {
		t.Fatalf("completed %d, rejected %d; want 2 and line 2 rejected", s.Completed, s.Rejected)
	}
	if got := readLines(t, cfg.Output+".rejected.jsonl"); len(got) != 1 || !strings.Contains(got[0], "more than the job reads") {
		t.Errorf("rejected file %q", got)
	}
}

// A job directory moved (renamed, or its volume mounted at another path) holds the same
// input, output, rejected and checkpoint files: the resume goes on there, though the
// recorded absolute paths are gone.
func TestResumeAfterTheJobDirectoryMoved(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, nil)
	cfg := setup(t, f, taskLines(3))
	run(t, cfg)

	oldDir := filepath.Dir(cfg.Output)
	newDir := oldDir + "-moved"
	if err := os.Rename(oldDir, newDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(newDir) })
	cfg.Input = filepath.Join(newDir, "in.jsonl")
	cfg.Output = filepath.Join(newDir, "out.jsonl")
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Errorf("resume in the moved directory: %v", err)
	}
	if got := readLines(t, cfg.Output); len(got) != 3 || !strings.Contains(got[0], `"id":1`) {
		t.Errorf("output after the resume: %q", got)
	}
}

// The checkpoint and the output told apart only by spelling, or by a link, are one
// file: the checkpoint's rename would replace the output.
func TestConfigRefusesOneFileUnderTwoNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	if err := os.WriteFile(out, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.jsonl")
	if err := os.Symlink(out, link); err != nil {
		t.Fatal(err)
	}
	for _, cp := range []string{dir + "/./out.jsonl", dir + "//out.jsonl", link} {
		cfg := Config{DispatcherURL: "http://127.0.0.1:1", Input: filepath.Join(dir, "in.jsonl"), Output: out, Checkpoint: cp}.WithDefaults()
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "four different files") {
			t.Errorf("checkpoint %q beside output %q: Validate = %v, want four different files", cp, out, err)
		}
	}
	cfg := Config{DispatcherURL: "http://127.0.0.1:1", Input: filepath.Join(dir, "in.jsonl"), Output: out}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Errorf("distinct files refused: %v", err)
	}
}
