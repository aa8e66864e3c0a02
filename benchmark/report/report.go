// Package report turns a benchmark run's numbers into what people read: the seed's
// "Worker Log Summary" / "Producer Log Summary" layout plus latency, a side-by-side
// comparison of routing and random dispatch, JSON for machines, and an SVG chart.
package report

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/smartroute/smartroute/benchmark/producer"
	"github.com/smartroute/smartroute/benchmark/workerlog"
)

// Modes of the dispatcher a result was measured with.
const (
	ModeRouting = "routing"
	ModeRandom  = "random"
)

// Settings are the knobs a run was measured with, printed so a result says what it is.
type Settings struct {
	Workers    int
	MaxLabels  int
	Slots      int
	Requests   int
	Producers  int
	Labels     int
	WaitAvg    time.Duration
	WaitStddev time.Duration
	SyncShare  float64
	TimeScale  float64
	Seed       int64
	// Backend is the agents' backend: "sim" (or empty) or "triton" (beside fake
	// Tritons, whose loads are scaled and whose runs are real inference).
	Backend string
	// SimLoadTime and SimRunTime are the simulated backend's times before scaling
	// (only the load time, for the fake Tritons' loads, with the triton backend).
	SimLoadTime time.Duration
	SimRunTime  time.Duration
}

// BackendTriton is Settings.Backend for agents beside fake Tritons.
const BackendTriton = "triton"

// Result is one measured run.
type Result struct {
	// Mode is ModeRouting or ModeRandom.
	Mode     string
	RunID    string
	Settings Settings
	// Worker is read from the agents' logs, Producer from the producers' records.
	Worker   workerlog.Summary
	Producer producer.Summary
	// OutDir holds the run's logs and records.
	OutDir string
	// EarlyExits say which of the run's processes (log collector, dispatcher, agents)
	// ended by themselves before the stop, and how: the run did not measure the fleet
	// asked for, and the worker summary may be read from incomplete logs.
	EarlyExits []string
}

// Describe is a one-line account of the settings.
func (s Settings) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d workers × %d labels, %d labels, %d requests from %d producers, wait %.2f ± %.2f s",
		s.Workers, s.MaxLabels, s.Labels, s.Requests, s.Producers, s.WaitAvg.Seconds(), s.WaitStddev.Seconds())
	if s.SyncShare != 1 {
		fmt.Fprintf(&b, ", %.0f%% sync", s.SyncShare*100)
	}
	fmt.Fprintf(&b, ", time-scale %g, seed %d", s.TimeScale, s.Seed)
	if s.Backend == BackendTriton {
		b.WriteString(", triton backend")
	}
	return b.String()
}

// unscaled converts a measured duration back to time-scale 1, for comparing with
// the seed's published numbers.
func (s Settings) unscaled(d time.Duration) time.Duration {
	if s.TimeScale <= 0 {
		return d
	}
	return time.Duration(float64(d) / s.TimeScale)
}

// unscaledRuntime is the average task runtime at time-scale 1. The simulated backend
// scales loads and runs alike; beside the fake Tritons only loads are scaled and runs
// are real inference, so the run part stays as measured.
func (s Settings) unscaledRuntime(w workerlog.Summary) time.Duration {
	if s.Backend != BackendTriton {
		return s.unscaled(w.AvgTaskRuntime)
	}
	run := min(w.AvgRunTime, w.AvgTaskRuntime)
	return s.unscaled(w.AvgTaskRuntime-run) + run
}

func secs(d time.Duration) string { return fmt.Sprintf("%.4f", d.Seconds()) }

// WriteText writes one result in the seed's layout, followed by latency, per-worker
// counts and any failures.
func WriteText(w io.Writer, r Result) error {
	ew := &errWriter{w: w}
	ew.printf("smartroute benchmark (%s): %s\n", r.Mode, r.Settings.Describe())
	if r.OutDir != "" {
		ew.printf("Logs and records: %s\n", r.OutDir)
	}
	ws, ps := r.Worker, r.Producer

	ew.printf("\nWorker Log Summary:\n")
	ew.printf("Total Label Misses: %d\n", ws.LabelMisses)
	ew.printf("Tasks Completed: %d\n", ws.TasksCompleted)
	ew.printf("Average Task Runtime: %s seconds", secs(ws.AvgTaskRuntime))
	if r.Settings.TimeScale != 1 && r.Settings.TimeScale > 0 {
		ew.printf(" (%s s at time-scale 1)", secs(r.Settings.unscaledRuntime(ws)))
	}
	ew.printf("\n")

	ew.printf("\nProducer Log Summary:\n")
	ew.printf("Total Requests: %d\n", ps.Requests)
	ew.printf("Total Failed Requests: %d\n", ps.Failed)
	ew.printf("Total Synchronous Requests: %d\n", ps.Sync)
	ew.printf("Total Dispatched Jobs: %d\n", ps.Dispatched)

	l := ps.Latency
	ew.printf("\nLatency Summary (end to end, %d completed requests):\n", l.Count)
	ew.printf("Mean Latency: %s seconds\n", secs(l.Mean))
	ew.printf("p50 Latency: %s seconds\n", secs(l.P50))
	ew.printf("p95 Latency: %s seconds\n", secs(l.P95))
	ew.printf("p99 Latency: %s seconds\n", secs(l.P99))
	ew.printf("Max Latency: %s seconds\n", secs(l.Max))
	ew.printf("Throughput: %.2f tasks/s\n", ps.Throughput)
	ew.printf("Wall Time: %.1f seconds\n", ps.Wall.Seconds())

	if len(ws.Workers) > 0 {
		ew.printf("\nPer Worker:\n")
		for _, id := range slices.Sorted(maps.Keys(ws.Workers)) {
			s := ws.Workers[id]
			ew.printf("%s: %d completed, %d failed, %d label misses", id, s.TasksCompleted, s.TasksFailed, s.LabelMisses)
			if s.TasksRerun > 0 {
				ew.printf(", %d runs lost (their tasks ran again)", s.TasksRerun)
			}
			if s.LogRecordsDropped > 0 || s.LogBatchesMissing > 0 {
				ew.printf(", %d log records dropped, %d log batches missing", s.LogRecordsDropped, s.LogBatchesMissing)
			}
			ew.printf("\n")
		}
	}
	for _, n := range Notes(r) {
		ew.printf("\nNote: %s\n", n)
	}
	if len(ps.Errors) > 0 {
		ew.printf("\nFailures:\n")
		for _, e := range topErrors(ps.Errors, 5) {
			ew.printf("%6d × %s\n", e.count, e.text)
		}
	}
	return ew.err
}

// Notes are what a reader should know about before trusting the counts: processes
// that died during the run, inconsistencies between the workers' and producers'
// accounts.
func Notes(r Result) []string {
	var notes []string
	for _, e := range r.EarlyExits {
		notes = append(notes, e+": the run lost a process; its counts may be short, and are not those of the fleet asked for")
	}
	ws, ps := r.Worker, r.Producer
	if ps.Completed > 0 && ws.TasksCompleted == 0 {
		notes = append(notes, fmt.Sprintf("the producers saw %d completed tasks but the worker logs hold no task_completed records: check the agents' --log-level and log format", ps.Completed))
	} else if ws.TasksCompleted != ps.Completed {
		notes = append(notes, fmt.Sprintf("the worker logs count %d completed tasks, the producers %d", ws.TasksCompleted, ps.Completed))
	}
	if ws.LogRecordsDropped > 0 || ws.LogBatchesMissing > 0 {
		notes = append(notes, fmt.Sprintf("the log collector noted %d log records dropped by the agents (their buffers were full) and %d log batches missing from its files: the worker counts are short by the records lost", ws.LogRecordsDropped, ws.LogBatchesMissing))
	}
	if ws.TasksRerun > 0 {
		notes = append(notes, fmt.Sprintf("%d task runs were repeated (a result lost with its connection; the dispatcher ran the task again): each task counts once, by its last run, and every run's label load counts", ws.TasksRerun))
	}
	if ws.LabelMisses != ps.LabelMisses && ps.Failed == 0 && ws.TasksFailed == 0 && ws.TasksCompleted > 0 {
		notes = append(notes, fmt.Sprintf("the worker logs count %d label misses, the dispatcher's answers %d", ws.LabelMisses, ps.LabelMisses))
	}
	return notes
}

type errorCount struct {
	text  string
	count int
}

func topErrors(m map[string]int, n int) []errorCount {
	var out []errorCount
	for text, count := range m {
		out = append(out, errorCount{text, count})
	}
	slices.SortFunc(out, func(a, b errorCount) int {
		return cmp.Or(cmp.Compare(b.count, a.count), strings.Compare(a.text, b.text))
	})
	return out[:min(n, len(out))]
}

// errWriter keeps the first write error so the text can be written without a check
// per line.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}
