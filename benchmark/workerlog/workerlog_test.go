package workerlog

import (
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func openFixtures(t *testing.T, names ...string) []io.Reader {
	t.Helper()
	var rs []io.Reader
	for _, n := range names {
		f, err := os.Open(filepath.Join("testdata", n))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		rs = append(rs, f)
	}
	return rs
}

func TestSummarizeFixtures(t *testing.T) {
	t.Parallel()
	s, err := Summarize(openFixtures(t, "bench-worker-1.log", "bench-worker-2.log")...)
	if err != nil {
		t.Fatal(err)
	}
	// Misses: r-1 (event + completed, once), r-3 (event + failed task, once),
	// r-6 (completed only), r-8 (event + completed, once).
	if s.LabelMisses != 4 {
		t.Errorf("LabelMisses = %d, want 4", s.LabelMisses)
	}
	// Completed ok: r-1, r-2, r-4, r-6, r-7, r-8; r-3 failed; r-5 does not decode.
	if s.TasksCompleted != 6 || s.TasksFailed != 1 {
		t.Errorf("TasksCompleted, TasksFailed = %d, %d, want 6, 1", s.TasksCompleted, s.TasksFailed)
	}
	// total_ms: 450 + 50 + 60 + 440 + 0 + (420+30, no total_ms) = 1450 over 6 tasks.
	if want := ms(1450.0 / 6); s.AvgTaskRuntime != want {
		t.Errorf("AvgTaskRuntime = %v, want %v", s.AvgTaskRuntime, want)
	}
	// Loads of the completed misses: r-1 401.5, r-6 400, r-8 420.
	if want := ms(1221.5 / 3); s.AvgLoadTime != want {
		t.Errorf("AvgLoadTime = %v, want %v", s.AvgLoadTime, want)
	}
	if want := ms(228.5 / 6); s.AvgRunTime != want {
		t.Errorf("AvgRunTime = %v, want %v", s.AvgRunTime, want)
	}
	want := map[string]WorkerStats{
		"bench-worker-1": {LabelMisses: 2, TasksCompleted: 3, TasksFailed: 1},
		"bench-worker-2": {LabelMisses: 2, TasksCompleted: 3},
	}
	if len(s.Workers) != len(want) {
		t.Errorf("Workers = %v, want %v", s.Workers, want)
	}
	for id, w := range want {
		if s.Workers[id] != w {
			t.Errorf("Workers[%s] = %+v, want %+v", id, s.Workers[id], w)
		}
	}
	// Skipped: the plain line, the truncated line and r-5 in log 1; the banner and
	// the array in log 2.
	if s.Skipped != 5 {
		t.Errorf("Skipped = %d, want 5", s.Skipped)
	}
}

func TestSummarizeTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name              string
		log               string
		misses, completed int
		avgRuntime        time.Duration
	}{
		{name: "empty", log: ""},
		{name: "only noise", log: "hello\n{\"level\":\"info\",\"message\":\"up\"}\n{not json}\n"},
		{
			name:       "ok missing counts as completed",
			log:        `{"event":"task_completed","worker_id":"w","task_id":"t","total_ms":10}`,
			completed:  1,
			avgRuntime: 10 * time.Millisecond,
		},
		{
			name:   "a miss without task id is never merged",
			log:    `{"event":"label_miss","worker_id":"w"}` + "\n" + `{"event":"label_miss","worker_id":"w"}`,
			misses: 2,
		},
		{
			name: "the same task missing on two workers is two misses",
			log: `{"event":"label_miss","worker_id":"w1","task_id":"t"}` + "\n" +
				`{"event":"label_miss","worker_id":"w2","task_id":"t"}`,
			misses: 2,
		},
		{
			// A worker that reconnects and gets its task back loads the label again.
			name: "two attempts of one task that both loaded on one worker are two misses",
			log: `{"event":"label_miss","worker_id":"w1","task_id":"t","attempt":1,"label":"a","load_ms":400}` + "\n" +
				`{"event":"label_miss","worker_id":"w1","task_id":"t","attempt":2,"label":"a","load_ms":400}` + "\n" +
				`{"event":"task_completed","worker_id":"w1","task_id":"t","attempt":2,"label":"a","label_miss":true,"total_ms":450,"ok":true}`,
			misses:     2,
			completed:  1,
			avgRuntime: 450 * time.Millisecond,
		},
		{
			name:       "no trailing newline and CRLF",
			log:        "{\"event\":\"task_completed\",\"task_id\":\"a\",\"total_ms\":1,\"ok\":true}\r\n{\"event\":\"task_completed\",\"task_id\":\"b\",\"total_ms\":3,\"ok\":true}",
			completed:  2,
			avgRuntime: 2 * time.Millisecond,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := Summarize(strings.NewReader(tt.log))
			if err != nil {
				t.Fatal(err)
			}
			if s.LabelMisses != tt.misses || s.TasksCompleted != tt.completed || s.AvgTaskRuntime != tt.avgRuntime {
				t.Errorf("got misses %d completed %d avg %v, want %d %d %v",
					s.LabelMisses, s.TasksCompleted, s.AvgTaskRuntime, tt.misses, tt.completed, tt.avgRuntime)
			}
		})
	}
}

func TestSummarizeReaderError(t *testing.T) {
	t.Parallel()
	_, err := Summarize(strings.NewReader("{}\n"), iotest.ErrReader(io.ErrUnexpectedEOF))
	if err == nil || !strings.Contains(err.Error(), "log 2") {
		t.Fatalf("err = %v, want an error naming log 2", err)
	}
}

// A task whose result was lost with its connection (the agent had queued it and
// logged the task as completed) is run again by the dispatcher: one task, one result
// for the producer, but two task_completed records. Each task used to count (and its
// runtime be averaged in) once per record.
func TestSummarizeRetriedTasks(t *testing.T) {
	t.Parallel()
	rec := func(worker, task string, attempt int, ok bool, miss bool, totalMS float64) string {
		return fmt.Sprintf(`{"event":"task_completed","worker_id":%q,"task_id":%q,"attempt":%d,"label":"a","label_miss":%v,"load_ms":%v,"run_ms":10,"total_ms":%v,"ok":%v}`,
			worker, task, attempt, miss, totalMS-10, totalMS, ok)
	}
	tests := []struct {
		name                             string
		logs                             []string // one reader each
		completed, failed, rerun, misses int
		avgRuntime                       time.Duration
		workers                          map[string]WorkerStats
	}{
		{
			name: "a retried task counts once, by its last run",
			logs: []string{
				rec("w1", "t", 1, true, false, 50) + "\n" + rec("w1", "u", 1, true, false, 30),
				rec("w2", "t", 2, true, true, 70),
			},
			completed: 2, rerun: 1, misses: 1, avgRuntime: 50 * time.Millisecond,
			workers: map[string]WorkerStats{"w1": {TasksCompleted: 1, TasksRerun: 1}, "w2": {TasksCompleted: 1, LabelMisses: 1}},
		},
		{
			name:      "the last run read first still decides",
			logs:      []string{rec("w2", "t", 2, true, false, 70), rec("w1", "t", 1, true, false, 50)},
			completed: 1, rerun: 1, avgRuntime: 70 * time.Millisecond,
			workers: map[string]WorkerStats{"w1": {TasksRerun: 1}, "w2": {TasksCompleted: 1}},
		},
		{
			// The producer got the failure of the second attempt.
			name:   "a lost ok run, then a failed one: failed",
			logs:   []string{rec("w1", "t", 1, true, false, 50) + "\n" + rec("w2", "t", 2, false, false, 20)},
			failed: 1, rerun: 1,
			workers: map[string]WorkerStats{"w1": {TasksRerun: 1}, "w2": {TasksFailed: 1}},
		},
		{
			// Each load was a real one.
			name:      "both runs' loads count",
			logs:      []string{rec("w1", "t", 1, true, true, 450) + "\n" + rec("w2", "t", 2, true, true, 440)},
			completed: 1, rerun: 1, misses: 2, avgRuntime: 440 * time.Millisecond,
			workers: map[string]WorkerStats{"w1": {TasksRerun: 1, LabelMisses: 1}, "w2": {TasksCompleted: 1, LabelMisses: 1}},
		},
		{
			name:      "on one attempt, an ok run wins whatever the order",
			logs:      []string{rec("w1", "t", 0, true, false, 50) + "\n" + rec("w1", "t", 0, false, false, 20)},
			completed: 1, rerun: 1, avgRuntime: 50 * time.Millisecond,
			workers: map[string]WorkerStats{"w1": {TasksCompleted: 1, TasksRerun: 1}},
		},
		{
			name:      "records without a task id are never merged",
			logs:      []string{rec("w1", "", 1, true, false, 50) + "\n" + rec("w1", "", 1, true, false, 50)},
			completed: 2, avgRuntime: 50 * time.Millisecond,
			workers: map[string]WorkerStats{"w1": {TasksCompleted: 2}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var rs []io.Reader
			for _, l := range tt.logs {
				rs = append(rs, strings.NewReader(l))
			}
			s, err := Summarize(rs...)
			if err != nil {
				t.Fatal(err)
			}
			if s.TasksCompleted != tt.completed || s.TasksFailed != tt.failed || s.TasksRerun != tt.rerun ||
				s.LabelMisses != tt.misses || s.AvgTaskRuntime != tt.avgRuntime {
				t.Errorf("completed %d failed %d rerun %d misses %d avg %v; want %d %d %d %d %v", s.TasksCompleted, s.TasksFailed,
					s.TasksRerun, s.LabelMisses, s.AvgTaskRuntime, tt.completed, tt.failed, tt.rerun, tt.misses, tt.avgRuntime)
			}
			if !maps.Equal(s.Workers, tt.workers) {
				t.Errorf("workers %+v, want %+v", s.Workers, tt.workers)
			}
		})
	}
}

// The log collector writes a note into a worker's file when the agent dropped records
// (its buffer was full) or batches are missing. The counts read from that file are
// then short, yet the notes were skipped as unknown events and the loss went unsaid.
func TestSummarizeCollectorNotes(t *testing.T) {
	t.Parallel()
	w1 := `{"level":"warn","time":"2025-01-01T10:00:00Z","worker_id":"w1","component":"log_collector","event":"log_records_dropped","dropped":250,"dropped_total":250,"message":"the agent dropped log records because its buffer was full"}
{"level":"warn","time":"2025-01-01T10:00:00Z","worker_id":"w1","component":"log_collector","event":"log_batches_missing","missing_from":3,"missing_to":7,"message":"log batches of this stream are not in the collector's files"}
{"event":"task_completed","worker_id":"w1","task_id":"t1","attempt":1,"label":"a","label_miss":false,"run_ms":50,"total_ms":50,"ok":true}
{"level":"warn","worker_id":"w1","component":"log_collector","event":"log_records_dropped","dropped":10,"dropped_total":260}
`
	// Values no collector writes count as nothing, or saturate; never wrap.
	w2 := `{"worker_id":"w2","component":"log_collector","event":"log_batches_missing","missing_from":9,"missing_to":8}
{"worker_id":"w2","component":"log_collector","event":"log_records_dropped","dropped":-5}
{"worker_id":"w2","component":"log_collector","event":"log_batches_missing","missing_from":1,"missing_to":1}
`
	s, err := Summarize(strings.NewReader(w1), strings.NewReader(w2))
	if err != nil {
		t.Fatal(err)
	}
	if s.LogRecordsDropped != 260 || s.LogBatchesMissing != 6 || s.TasksCompleted != 1 || s.Records != 7 || s.Skipped != 0 {
		t.Errorf("dropped %d, missing %d, completed %d, records %d, skipped %d; want 260, 6, 1, 7, 0",
			s.LogRecordsDropped, s.LogBatchesMissing, s.TasksCompleted, s.Records, s.Skipped)
	}
	want := map[string]WorkerStats{
		"w1": {TasksCompleted: 1, LogRecordsDropped: 260, LogBatchesMissing: 5},
		"w2": {LogBatchesMissing: 1},
	}
	if !maps.Equal(s.Workers, want) {
		t.Errorf("workers %+v, want %+v", s.Workers, want)
	}
	huge := `{"worker_id":"w","event":"log_records_dropped","dropped":18446744073709551615}` + "\n" +
		`{"worker_id":"w","event":"log_records_dropped","dropped":18446744073709551615}` + "\n" +
		`{"worker_id":"w","event":"log_batches_missing","missing_from":0,"missing_to":1e300}`
	if s, err := Summarize(strings.NewReader(huge)); err != nil || s.LogRecordsDropped != math.MaxInt || s.LogBatchesMissing != math.MaxInt {
		t.Errorf("huge counts: dropped %d, missing %d (%v); want both math.MaxInt", s.LogRecordsDropped, s.LogBatchesMissing, err)
	}
}
