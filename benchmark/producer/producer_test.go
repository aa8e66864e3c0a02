package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeDispatcher answers like the dispatcher's task API. Sync tasks complete at once;
// async ones report "running" on the first poll and end on the second.
type fakeDispatcher struct {
	// reject, when set, answers the POST with this status and error for a label.
	reject map[string]int
	// failAsync lists labels whose async tasks end "failed".
	failAsync map[string]bool

	mu     sync.Mutex
	bodies []map[string]any
	tasks  map[string]*fakeTask
	polls  int
}

type fakeTask struct {
	label string
	polls int
}

func newFakeDispatcher(t *testing.T, fd *fakeDispatcher) *httptest.Server {
	t.Helper()
	fd.tasks = map[string]*fakeTask{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /run-task", fd.runTask)
	mux.HandleFunc("GET /tasks/{id}", fd.getTask)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (fd *fakeDispatcher) runTask(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	id, _ := body["task_id"].(string)
	label, _ := body["label"].(string)
	fd.mu.Lock()
	fd.bodies = append(fd.bodies, body)
	fd.mu.Unlock()
	if status, ok := fd.reject[label]; ok {
		writeJSON(w, status, map[string]string{"error": "rejected " + label})
		return
	}
	if rr, ok := body["return_result"]; ok && rr == false {
		fd.mu.Lock()
		fd.tasks[id] = &fakeTask{label: label}
		fd.mu.Unlock()
		writeJSON(w, http.StatusAccepted, map[string]string{"task_id": id, "status": "queued"})
		return
	}
	writeJSON(w, http.StatusOK, completed(id, label))
}

func completed(id, label string) map[string]any {
	return map[string]any{
		"task_id": id, "status": "completed", "worker_id": "w-" + label, "label": label,
		"label_miss": label == "label-1", "attempts": 1, "queue_ms": 1.5, "load_ms": 0, "run_ms": 2,
		"result": map[string]any{"echo": "sample"},
	}
}

func (fd *fakeDispatcher) getTask(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	fd.mu.Lock()
	defer fd.mu.Unlock()
	fd.polls++
	task, ok := fd.tasks[id]
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "unknown task " + id})
		return
	}
	task.polls++
	switch {
	case task.polls < 2:
		writeJSON(w, http.StatusOK, map[string]string{"task_id": id, "status": "running"})
	case fd.failAsync[task.label]:
		writeJSON(w, http.StatusOK, map[string]string{"task_id": id, "status": "failed", "error": "backend broke"})
	default:
		writeJSON(w, http.StatusOK, completed(id, task.label))
	}
}

// sleepRecorder stands in for the pause between requests: it records the pause and
// returns at once.
type sleepRecorder struct {
	mu     sync.Mutex
	pauses []time.Duration
}

func (s *sleepRecorder) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.pauses = append(s.pauses, d)
	s.mu.Unlock()
	return ctx.Err()
}

func baseConfig(url string, sr *sleepRecorder) Config {
	return Config{
		BaseURL:      url,
		RunID:        "r",
		Requests:     10,
		Producers:    2,
		WaitAvg:      time.Second,
		WaitStddev:   500 * time.Millisecond,
		Labels:       []string{"label-1", "label-2", "label-3", "label-4"},
		SyncShare:    1,
		Seed:         1,
		PollInterval: time.Millisecond,
		Sleep:        sr.sleep,
	}
}

func TestRunSync(t *testing.T) {
	t.Parallel()
	fd := &fakeDispatcher{}
	srv := newFakeDispatcher(t, fd)
	sr := &sleepRecorder{}
	var mu sync.Mutex
	var seen []int
	cfg := baseConfig(srv.URL, sr)
	cfg.OnResult = func(r Record) { mu.Lock(); seen = append(seen, r.N); mu.Unlock() }

	records, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(records) != 10 {
		t.Fatalf("got %d records, want 10", len(records))
	}
	for i, r := range records {
		if r.N != i+1 || r.TaskID != fmt.Sprintf("bench-r-%d", i+1) {
			t.Errorf("record %d: N %d task id %q", i, r.N, r.TaskID)
		}
		if !r.OK || !r.Sync || !r.Dispatched || r.HTTPStatus != 200 || r.Status != "completed" || r.Error != "" {
			t.Errorf("record %d: %+v, want a completed sync request", i, r)
		}
		if r.WorkerID != "w-"+r.Label || r.LabelMiss != (r.Label == "label-1") || r.QueueMS != 1.5 || r.RunMS != 2 || r.Attempts != 1 {
			t.Errorf("record %d: response fields not recorded: %+v", i, r)
		}
	}
	// Producer 0 sends 1..5, producer 1 sends 6..10.
	if records[0].Producer != 0 || records[9].Producer != 1 {
		t.Errorf("producers of first and last: %d %d", records[0].Producer, records[9].Producer)
	}
	slices.Sort(seen)
	if len(seen) != 10 || seen[0] != 1 || seen[9] != 10 {
		t.Errorf("OnResult saw %v", seen)
	}
	for _, b := range fd.bodies {
		if _, ok := b["return_result"]; ok {
			t.Errorf("sync body carries return_result: %v", b)
		}
		if b["parameters_json"] != `{"data": "sample"}` || b["task_type"] != "sample_task" {
			t.Errorf("body = %v", b)
		}
	}
	// No pause after a producer's last request.
	if len(sr.pauses) != 8 {
		t.Errorf("%d pauses, want 8", len(sr.pauses))
	}
	s := Summarize(records)
	if s.Requests != 10 || s.Failed != 0 || s.Sync != 10 || s.Dispatched != 10 || s.Completed != 10 {
		t.Errorf("summary = %+v", s)
	}
}

func TestRunAsync(t *testing.T) {
	t.Parallel()
	fd := &fakeDispatcher{failAsync: map[string]bool{"label-2": true}}
	srv := newFakeDispatcher(t, fd)
	cfg := baseConfig(srv.URL, &sleepRecorder{})
	cfg.Requests = 40
	cfg.SyncShare = 0.5

	records, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var sync, async, failed int
	for _, r := range records {
		if !r.Dispatched {
			t.Errorf("%s not dispatched: %+v", r.TaskID, r)
		}
		wantOK := r.Sync || r.Label != "label-2"
		if r.OK != wantOK {
			t.Errorf("%s (sync %v, %s): ok %v, want %v; error %q", r.TaskID, r.Sync, r.Label, r.OK, wantOK, r.Error)
		}
		if r.Sync {
			sync++
			continue
		}
		async++
		if r.HTTPStatus != http.StatusAccepted {
			t.Errorf("%s: POST status %d, want 202", r.TaskID, r.HTTPStatus)
		}
		if !r.OK {
			failed++
			if r.Status != "failed" || !strings.Contains(r.Error, "backend broke") {
				t.Errorf("%s: status %q error %q", r.TaskID, r.Status, r.Error)
			}
		} else if r.WorkerID != "w-"+r.Label {
			t.Errorf("%s: polled result not recorded: %+v", r.TaskID, r)
		}
	}
	if sync == 0 || async == 0 || failed == 0 {
		t.Fatalf("sync %d async %d failed %d: the seed should give some of each", sync, async, failed)
	}
	fd.mu.Lock()
	polls := fd.polls
	fd.mu.Unlock()
	if polls != 2*async {
		t.Errorf("%d polls, want %d (two per async task)", polls, 2*async)
	}
	s := Summarize(records)
	if s.Requests != 40 || s.Sync != sync || s.Dispatched != 40 || s.Failed != failed || s.Completed != 40-failed {
		t.Errorf("summary = %+v", s)
	}
}

func TestRunFailures(t *testing.T) {
	t.Parallel()
	// Refusals at admission (a 504 is not one: only a task taken in has a deadline).
	fd := &fakeDispatcher{reject: map[string]int{"label-2": http.StatusServiceUnavailable, "label-3": http.StatusTooManyRequests}}
	srv := newFakeDispatcher(t, fd)
	cfg := baseConfig(srv.URL, &sleepRecorder{})
	cfg.Requests = 30

	records, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var rejected int
	for _, r := range records {
		status, rejectedLabel := fd.reject[r.Label]
		if !rejectedLabel {
			if !r.OK {
				t.Errorf("%s failed: %s", r.TaskID, r.Error)
			}
			continue
		}
		rejected++
		want := fmt.Sprintf("HTTP %d: rejected %s", status, r.Label)
		if r.OK || r.Dispatched || r.HTTPStatus != status || r.Error != want {
			t.Errorf("%s: ok %v dispatched %v status %d error %q, want error %q", r.TaskID, r.OK, r.Dispatched, r.HTTPStatus, r.Error, want)
		}
	}
	s := Summarize(records)
	if rejected == 0 || s.Failed != rejected || s.Dispatched != 30-rejected || s.Latency.Count != 30-rejected {
		t.Errorf("rejected %d, summary %+v", rejected, s)
	}
	if got := s.Errors["HTTP 503: rejected label-2"] + s.Errors["HTTP 429: rejected label-3"]; got != rejected {
		t.Errorf("Errors = %v", s.Errors)
	}
}

// A synchronous task that the dispatcher took in and that then failed is answered
// with the task's view and the failure's status (502 worker error, 504 deadline or a
// worker's overrun); an
// asynchronous one gets 202 and the same view from GET /tasks/{id}. Both were
// dispatched: "Total Dispatched Jobs" must not depend on sync vs async. Only 200 and
// 202 used to count, and the synchronous record lost the view (status, worker, miss).
func TestSyncFailureAfterAdmissionCountsAsDispatched(t *testing.T) {
	t.Parallel()
	view := func(id, status string, attempts int, worker, errMsg string) map[string]any {
		v := map[string]any{"task_id": id, "status": status, "label": "a", "task_type": "sample_task",
			"label_miss": worker != "", "attempts": attempts, "queue_ms": 1, "load_ms": 0, "run_ms": 0, "error": errMsg}
		if worker != "" {
			v["worker_id"] = worker
		}
		return v
	}
	errorOnly := func(msg string) func(string) any {
		return func(string) any { return map[string]string{"error": msg} }
	}
	tests := []struct {
		name       string
		status     int
		answer     func(id string) any // the synchronous answer; nil for the async flow's
		dispatched bool
		wantStatus string // the record's Status
	}{
		{"worker error", http.StatusBadGateway, func(id string) any { return view(id, "failed", 1, "w1", "worker error: boom") }, true, "failed"},
		{"load failed on every attempt", http.StatusBadGateway, func(id string) any { return view(id, "failed", 3, "w1", "load failed: oom") }, true, "failed"},
		{"deadline while running", http.StatusGatewayTimeout, func(id string) any { return view(id, "failed", 1, "w1", "deadline exceeded while running: ") }, true, "failed"},
		{"deadline while queued", http.StatusGatewayTimeout, func(id string) any { return view(id, "failed", 0, "", "deadline exceeded") }, true, "failed"},
		{"worker overran the deadline", http.StatusGatewayTimeout, func(id string) any {
			return view(id, "failed", 1, "w1", `deadline exceeded: worker "w1" overran it by 5s and did not answer; its attempt was cancelled`)
		}, true, "failed"},
		{"workers lost on every attempt", http.StatusServiceUnavailable, func(id string) any { return view(id, "failed", 3, "", "too many attempts") }, true, "failed"},
		// Refusals: the task was never taken in.
		{"no worker can load the label", http.StatusServiceUnavailable, func(id string) any {
			return view(id, "failed", 0, "", `no connected worker can load label "a"`)
		}, false, "failed"},
		{"queue full", http.StatusTooManyRequests, errorOnly("queue full: 10 tasks waiting"), false, ""},
		{"shutting down", http.StatusServiceUnavailable, errorOnly("dispatcher is shutting down"), false, ""},
		{"bad body", http.StatusBadRequest, errorOnly("label is required"), false, ""},
		{"too large", http.StatusRequestEntityTooLarge, errorOnly("body larger than 1 bytes"), false, ""},
		{"a proxy's bad gateway", http.StatusBadGateway, func(string) any { return "<html>bad gateway</html>" }, false, ""},
		// A dispatcher's 504 always carries the task's view; one without is not its
		// answer, and says nothing of whether the task was taken in.
		{"a proxy's gateway timeout", http.StatusGatewayTimeout, func(string) any { return "<html>gateway timeout</html>" }, false, ""},
		{"a 504 without the task's view", http.StatusGatewayTimeout, errorOnly("upstream request timeout"), false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mux := http.NewServeMux()
			mux.HandleFunc("POST /run-task", func(w http.ResponseWriter, r *http.Request) {
				var body map[string]any
				json.NewDecoder(r.Body).Decode(&body)
				id := body["task_id"].(string)
				if rr, ok := body["return_result"]; ok && rr == false && tt.dispatched {
					writeJSON(w, http.StatusAccepted, map[string]string{"task_id": id, "status": "queued"})
					return
				}
				writeJSON(w, tt.status, tt.answer(id))
			})
			mux.HandleFunc("GET /tasks/{id}", func(w http.ResponseWriter, r *http.Request) {
				v := view(r.PathValue("id"), "failed", 1, "w1", "failed")
				if a, ok := tt.answer(r.PathValue("id")).(map[string]any); ok {
					v = a
				}
				writeJSON(w, http.StatusOK, v)
			})
			srv := httptest.NewServer(mux)
			defer srv.Close()
			run := func(share float64) ([]Record, Summary) {
				cfg := baseConfig(srv.URL, &sleepRecorder{})
				cfg.Requests, cfg.SyncShare, cfg.PollInterval = 4, share, time.Millisecond
				recs, err := Run(t.Context(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				return recs, Summarize(recs)
			}
			syncRecs, syncSum := run(1)
			_, asyncSum := run(0)
			want := 0
			if tt.dispatched {
				want = 4
			}
			if syncSum.Dispatched != want || asyncSum.Dispatched != want || syncSum.Failed != 4 {
				t.Errorf("Dispatched: sync %d, async %d, want %d (failed %d)", syncSum.Dispatched, asyncSum.Dispatched, want, syncSum.Failed)
			}
			r := syncRecs[0]
			if r.HTTPStatus != tt.status || r.OK || r.Status != tt.wantStatus || r.Error == "" {
				t.Errorf("record %+v, want HTTP %d, status %q and an error", r, tt.status, tt.wantStatus)
			}
			if v, ok := tt.answer(r.TaskID).(map[string]any); ok && tt.dispatched {
				// The view is kept, as for an asynchronous task that failed.
				if w, _ := v["worker_id"].(string); r.WorkerID != w || r.LabelMiss != (w != "") || r.Attempts != v["attempts"] {
					t.Errorf("record %+v lost the answer's worker, miss or attempts (%v)", r, v)
				}
			}
		})
	}
}

func TestRunUnreachable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	records, err := Run(t.Context(), baseConfig(url, &sleepRecorder{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range records {
		if r.OK || r.Dispatched || r.HTTPStatus != 0 || r.Error == "" {
			t.Errorf("%+v, want a failed request with an error", r)
		}
	}
	if s := Summarize(records); s.Failed != 10 || s.Requests != 10 {
		t.Errorf("summary = %+v", s)
	}
}

func TestRunNonJSONError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, "proxy says no", http.StatusBadGateway)
	}))
	t.Cleanup(srv.Close)
	cfg := baseConfig(srv.URL, &sleepRecorder{})
	cfg.Requests = 1
	records, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := records[0].Error; got != "HTTP 502: proxy says no" {
		t.Errorf("error = %q", got)
	}
}

func TestRunRequestTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Never answers; the client gives up. Reading the body lets the server notice
		// the client hanging up; release ends the handler whatever happens.
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	cfg := baseConfig(srv.URL, &sleepRecorder{})
	cfg.Requests = 2
	cfg.RequestTimeout = 20 * time.Millisecond
	records, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range records {
		if r.OK || !strings.Contains(r.Error, "deadline exceeded") {
			t.Errorf("%+v, want a deadline error", r)
		}
	}
}

func TestRunCancel(t *testing.T) {
	t.Parallel()
	srv := newFakeDispatcher(t, &fakeDispatcher{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cfg := baseConfig(srv.URL, nil)
	cfg.Producers = 1
	cfg.OnResult = func(Record) { cancel() }
	cfg.Sleep = func(ctx context.Context, d time.Duration) error {
		<-ctx.Done()
		return ctx.Err()
	}
	records, err := Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if len(records) != 1 || !records[0].OK {
		t.Fatalf("records = %+v, want the one request sent before the cancel", records)
	}
}

func TestRunSeedDeterminesSequence(t *testing.T) {
	t.Parallel()
	srv := newFakeDispatcher(t, &fakeDispatcher{})
	run := func(seed uint64) ([]string, []time.Duration) {
		sr := &sleepRecorder{}
		cfg := baseConfig(srv.URL, sr)
		cfg.Seed = seed
		cfg.Producers = 1
		cfg.Requests = 30
		records, err := Run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var labels []string
		for _, r := range records {
			labels = append(labels, r.Label)
		}
		return labels, sr.pauses
	}
	l1, p1 := run(7)
	l2, p2 := run(7)
	l3, _ := run(8)
	if !slices.Equal(l1, l2) || !slices.Equal(p1, p2) {
		t.Error("the same seed gave different sequences")
	}
	if slices.Equal(l1, l3) {
		t.Error("seeds 7 and 8 gave the same labels")
	}
	counts := map[string]int{}
	for _, l := range l1 {
		counts[l]++
	}
	if len(counts) != 4 {
		t.Errorf("30 uniform draws over 4 labels hit only %v", counts)
	}
}

func TestRunPausesScaled(t *testing.T) {
	t.Parallel()
	srv := newFakeDispatcher(t, &fakeDispatcher{})
	sr := &sleepRecorder{}
	cfg := baseConfig(srv.URL, sr)
	cfg.WaitAvg, cfg.WaitStddev = 0, 0
	cfg.TimeScale = 0.5
	if _, err := Run(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	for _, p := range sr.pauses {
		if p != 50*time.Millisecond {
			t.Fatalf("pause %v, want the 100 ms floor scaled to 50 ms", p)
		}
	}
}

func TestWaitDistribution(t *testing.T) {
	t.Parallel()
	const n = 20000
	tests := []struct {
		name         string
		avg, stddev  time.Duration
		scale        float64
		wantFloor    float64 // share of draws at the floor, ±0.02
		wantMeanSecs float64 // ±3%
	}{
		// With a = (0.1-μ)/σ: P(X < 0.1) = Φ(a) and
		// E[max(0.1, X)] = 0.1·Φ(a) + μ·(1-Φ(a)) + σ·φ(a).
		// μ=1, σ=0.5: a = -1.8, Φ = 0.0359, φ = 0.0790.
		{"seed default", time.Second, 500 * time.Millisecond, 1, 0.036, 1.0072},
		// μ=0.75, σ=1: a = -0.65, Φ = 0.2578, φ = 0.3230.
		{"seed 4-label run", 750 * time.Millisecond, time.Second, 1, 0.258, 0.9054},
		{"scaled by 0.1", 750 * time.Millisecond, time.Second, 0.1, 0.258, 0.09054},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rng := NewRand(3, 0)
			floor := time.Duration(float64(MinWait) * tt.scale)
			var atFloor int
			var sum float64
			for range n {
				w := Wait(rng, tt.avg, tt.stddev, tt.scale)
				if w < floor {
					t.Fatalf("pause %v below the floor %v", w, floor)
				}
				if w == floor {
					atFloor++
				}
				sum += w.Seconds()
			}
			if share := float64(atFloor) / n; math.Abs(share-tt.wantFloor) > 0.02 {
				t.Errorf("share at the floor %.3f, want %.3f", share, tt.wantFloor)
			}
			if mean := sum / n; math.Abs(mean-tt.wantMeanSecs)/tt.wantMeanSecs > 0.03 {
				t.Errorf("mean pause %.4fs, want %.4fs", mean, tt.wantMeanSecs)
			}
		})
	}
}

func TestShare(t *testing.T) {
	t.Parallel()
	tests := []struct {
		total, n int
		want     []int
	}{
		{10, 2, []int{5, 5}},
		{10, 3, []int{4, 3, 3}},
		{2, 4, []int{1, 1, 0, 0}},
		{2400, 2, []int{1200, 1200}},
	}
	for _, tt := range tests {
		var got []int
		for i := range tt.n {
			got = append(got, Share(tt.total, tt.n, i))
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("Share(%d, %d) = %v, want %v", tt.total, tt.n, got, tt.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := baseConfig("http://127.0.0.1:1", &sleepRecorder{})
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no url", func(c *Config) { c.BaseURL = "" }, "BaseURL"},
		{"no requests", func(c *Config) { c.Requests = 0 }, "Requests"},
		{"no producers", func(c *Config) { c.Producers = 0 }, "Producers"},
		{"no labels", func(c *Config) { c.Labels = nil }, "Labels"},
		{"sync share", func(c *Config) { c.SyncShare = 1.5 }, "SyncShare"},
		{"nan sync share", func(c *Config) { c.SyncShare = math.NaN() }, "SyncShare"},
		{"negative scale", func(c *Config) { c.TimeScale = -1 }, "TimeScale"},
		{"negative wait", func(c *Config) { c.WaitAvg = -1 }, "WaitAvg"},
	}
	for _, tt := range tests {
		c := good
		tt.mutate(&c)
		_, err := Run(t.Context(), c)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want one naming %s", tt.name, err, tt.want)
		}
	}
}
