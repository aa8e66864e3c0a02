package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/benchmark/producer"
	"github.com/smartroute/smartroute/benchmark/workerlog"
)

func seconds(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }

// seedResult is a result with the seed's published 4-label numbers.
func seedResult(mode string, misses int, runtime float64) Result {
	return Result{
		Mode:  mode,
		RunID: mode + "-1",
		Settings: Settings{
			Workers: 2, MaxLabels: 2, Slots: 1, Requests: 2400, Producers: 2, Labels: 4,
			WaitAvg: 750 * time.Millisecond, WaitStddev: time.Second, SyncShare: 1, TimeScale: 1, Seed: 1,
			SimLoadTime: 400 * time.Millisecond, SimRunTime: 50 * time.Millisecond,
		},
		Worker: workerlog.Summary{
			LabelMisses: misses, TasksCompleted: 2400, AvgTaskRuntime: seconds(runtime),
			Workers: map[string]workerlog.WorkerStats{
				"bench-worker-2": {TasksCompleted: 1100, LabelMisses: misses / 2},
				"bench-worker-1": {TasksCompleted: 1300, LabelMisses: misses - misses/2},
			},
		},
		Producer: producer.Summary{
			Requests: 2400, Sync: 2400, Dispatched: 2400, Completed: 2400, LabelMisses: misses,
			Latency: producer.LatencyStats{
				Count: 2400, Mean: seconds(runtime * 1.2), P50: seconds(runtime), P95: seconds(runtime * 3), P99: seconds(runtime * 5), Max: seconds(runtime * 8),
			},
			Wall:       900 * time.Second,
			Throughput: 2400.0 / 900,
		},
	}
}

func seedComparison() Comparison {
	return Comparison{Routing: seedResult(ModeRouting, 138, 0.0639), Random: seedResult(ModeRandom, 1193, 0.2483)}
}

func TestWriteTextSeedLayout(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := WriteText(&b, seedResult(ModeRouting, 138, 0.0639)); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	want := `
Worker Log Summary:
Total Label Misses: 138
Tasks Completed: 2400
Average Task Runtime: 0.0639 seconds

Producer Log Summary:
Total Requests: 2400
Total Failed Requests: 0
Total Synchronous Requests: 2400
Total Dispatched Jobs: 2400
`
	if !strings.Contains(out, want) {
		t.Errorf("output lacks the seed's layout:\n%s", out)
	}
	for _, w := range []string{
		"smartroute benchmark (routing): 2 workers × 2 labels, 4 labels, 2400 requests from 2 producers, wait 0.75 ± 1.00 s, time-scale 1, seed 1",
		"p95 Latency: 0.1917 seconds",
		"Throughput: 2.67 tasks/s",
		"Wall Time: 900.0 seconds",
		"Per Worker:\nbench-worker-1: 1300 completed, 0 failed, 69 label misses\nbench-worker-2: 1100 completed",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "Note:") || strings.Contains(out, "at time-scale 1") {
		t.Errorf("unexpected note or scale line:\n%s", out)
	}
}

func TestWriteTextScaledAndNotes(t *testing.T) {
	t.Parallel()
	r := seedResult(ModeRandom, 10, 0.02483)
	r.Settings.TimeScale = 0.1
	r.Worker.TasksCompleted = 0
	r.Producer.Failed = 2
	r.Producer.Errors = map[string]int{"HTTP 504: deadline": 2, "HTTP 503: full": 1}
	var b bytes.Buffer
	if err := WriteText(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, w := range []string{
		"Average Task Runtime: 0.0248 seconds (0.2483 s at time-scale 1)",
		"Note: the producers saw 2400 completed tasks but the worker logs hold no task_completed records",
		"Failures:\n     2 × HTTP 504: deadline\n     1 × HTTP 503: full\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// Beside fake Tritons only loads are scaled; runs are real inference and stay as
// measured when the runtime is put back at time-scale 1.
func TestTritonRuntimeUnscalesOnlyLoads(t *testing.T) {
	t.Parallel()
	r := seedResult(ModeRouting, 10, 0.0230)
	r.Settings.TimeScale, r.Settings.Backend = 0.05, BackendTriton
	r.Worker.AvgRunTime = 3 * time.Millisecond // of the 23 ms: 20 ms of (scaled) loads
	var b bytes.Buffer
	if err := WriteText(&b, r); err != nil {
		t.Fatal(err)
	}
	if want := "Average Task Runtime: 0.0230 seconds (0.4030 s at time-scale 1)"; !strings.Contains(b.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, b.String())
	}
	b.Reset()
	if err := WriteJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Settings map[string]any `json:"settings"`
		Worker   struct {
			Unscaled float64 `json:"avg_task_runtime_unscaled_s"`
		} `json:"worker"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Settings["sim_run_time_s"]; ok || got.Settings["backend"] != "triton" || math.Abs(got.Worker.Unscaled-0.403) > 1e-9 {
		t.Errorf("JSON settings %v, unscaled runtime %v; want backend triton, no sim_run_time_s, 0.403", got.Settings, got.Worker.Unscaled)
	}
}

func TestRatios(t *testing.T) {
	t.Parallel()
	c := seedComparison()
	tests := []struct {
		name  string
		got   Ratio
		value float64
		text  string
	}{
		{"misses", c.Misses(), 1193.0 / 138, "8.6x fewer misses"},
		{"runtime", c.Runtime(), 0.2483 / 0.0639, "3.9x shorter"},
		{"p95", c.P95(), 0.2483 / 0.0639, "3.9x lower"},
		{"throughput", c.Throughput(), 1, "1.0x higher"},
		{"worse", lowerIsBetter(20, 10, "fewer misses", "more misses"), 0.5, "2.0x more misses"},
		{"routing zero", lowerIsBetter(0, 10, "fewer misses", "more misses"), math.Inf(1), "∞ fewer misses"},
		{"random zero", lowerIsBetter(10, 0, "fewer misses", "more misses"), 0, "∞ more misses"},
	}
	for _, tt := range tests {
		if math.Abs(tt.got.Value-tt.value) > 1e-6 && !(math.IsInf(tt.value, 1) && math.IsInf(tt.got.Value, 1)) || tt.got.Text != tt.text {
			t.Errorf("%s: %+v, want %v %q", tt.name, tt.got, tt.value, tt.text)
		}
	}
	if both := lowerIsBetter(0, 0, "a", "b"); !math.IsNaN(both.Value) || both.Text != "same (both zero)" {
		t.Errorf("both zero: %+v", both)
	}
}

// A run that completed no task (every request failed) has a runtime, latencies and
// misses of zero because nothing ran: not an infinite win. Its ratios say n/a, and
// --json writes null for them.
func TestEmptyRunIsNotAWin(t *testing.T) {
	c := seedComparison()
	c.Routing.Worker.TasksCompleted, c.Routing.Worker.AvgTaskRuntime, c.Routing.Worker.LabelMisses = 0, 0, 0
	c.Routing.Producer.Completed, c.Routing.Producer.Failed = 0, c.Routing.Producer.Requests
	c.Routing.Producer.Latency = producer.LatencyStats{}
	c.Routing.Producer.Throughput = 0
	for name, r := range map[string]Ratio{"misses": c.Misses(), "runtime": c.Runtime(), "p95": c.P95()} {
		if !math.IsNaN(r.Value) || !strings.Contains(r.Text, "n/a") {
			t.Errorf("%s: a run with no completed task compares as %+v, want n/a", name, r)
		}
	}
	var b strings.Builder
	if err := WriteComparison(&b, c); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(b.String(), "\n") {
		// Its throughput of 0 is a true loss ("∞ lower"); the rest is no data.
		if strings.Contains(line, "∞") && !strings.HasPrefix(line, "Throughput") {
			t.Errorf("the comparison table calls the empty run a win: %q", line)
		}
	}
}

func TestWriteComparison(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := WriteComparison(&b, seedComparison()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, w := range []string{
		"==== routing ====\nsmartroute benchmark (routing)",
		"==== random ====\nsmartroute benchmark (random)",
		"==== routing vs random ====",
		"routing        random   ratio",
		"Total Label Misses                 138          1193   8.6x fewer misses",
		"Average Task Runtime          0.0639 s      0.2483 s   3.9x shorter",
		"p95 Latency",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func TestWriteJSON(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	c := seedComparison()
	c.Routing.Worker.LabelMisses = 0
	if err := WriteComparisonJSON(&b, c); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Routing struct {
			Mode   string `json:"mode"`
			Worker struct {
				TasksCompleted int     `json:"tasks_completed"`
				AvgTaskRuntime float64 `json:"avg_task_runtime_s"`
			} `json:"worker"`
			Producer struct {
				Latency struct {
					P95 float64 `json:"p95_s"`
				} `json:"latency"`
			} `json:"producer"`
		} `json:"routing"`
		Ratios map[string]struct {
			Value *float64 `json:"value"`
			Text  string   `json:"text"`
		} `json:"ratios"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if got.Routing.Mode != "routing" || got.Routing.Worker.TasksCompleted != 2400 || got.Routing.Worker.AvgTaskRuntime != 0.0639 {
		t.Errorf("routing = %+v", got.Routing)
	}
	if m := got.Ratios["label_misses"]; m.Value != nil || m.Text != "∞ fewer misses" {
		t.Errorf("an infinite ratio must be null with its text: %+v", m)
	}
	if r := got.Ratios["avg_task_runtime"]; r.Value == nil || math.Abs(*r.Value-0.2483/0.0639) > 1e-9 {
		t.Errorf("avg_task_runtime ratio = %+v", r)
	}

	b.Reset()
	if err := WriteJSON(&b, seedResult(ModeRandom, 1, 0.1)); err != nil || !json.Valid(b.Bytes()) {
		t.Errorf("WriteJSON: %v\n%s", err, b.String())
	}
}

func TestWriteChart(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	c := seedComparison()
	c.Routing.Settings.Seed = 7 // the description must be escaped: "×" and "±" are fine, "<" would not be
	if err := WriteChart(&b, c); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML whose root is svg, with two bars per panel.
	dec := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	var root string
	var rects, texts int
	var content strings.Builder
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, b.String())
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = el.Name.Local
			}
			switch el.Name.Local {
			case "rect":
				rects++
			case "text":
				texts++
			}
		case xml.CharData:
			content.Write(el)
		}
	}
	if root != "svg" {
		t.Errorf("root element %q", root)
	}
	// Background, two legend swatches, six bars.
	if rects != 9 {
		t.Errorf("%d rects, want 9", rects)
	}
	for _, w := range []string{"138", "1193", "0.0639", "0.2483", "8.6x fewer misses", "3.9x shorter", "Label misses", "p95 latency (s)", "seed 7"} {
		if !strings.Contains(content.String(), w) {
			t.Errorf("chart text lacks %q", w)
		}
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteErrors(t *testing.T) {
	t.Parallel()
	c := seedComparison()
	for name, err := range map[string]error{
		"text":       WriteText(failWriter{}, c.Routing),
		"comparison": WriteComparison(failWriter{}, c),
		"json":       WriteJSON(failWriter{}, c.Routing),
		"chart":      WriteChart(failWriter{}, c),
	} {
		if err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

// A process that died during the run is told in the notes, the text and the JSON:
// the counts may be short (a crashed log collector) and are not those of the fleet
// asked for (a crashed agent).
func TestEarlyExitsReported(t *testing.T) {
	t.Parallel()
	r := seedResult(ModeRouting, 138, 0.0639)
	r.EarlyExits = []string{"log-collector exited by itself before it was stopped (exit status 3; its stderr: x)"}
	notes := Notes(r)
	if len(notes) != 1 || !strings.HasPrefix(notes[0], r.EarlyExits[0]) {
		t.Errorf("notes %q, want the early exit", notes)
	}
	var text, js bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "Note: log-collector exited by itself") {
		t.Errorf("text lacks the note:\n%s", text.String())
	}
	if err := WriteJSON(&js, r); err != nil {
		t.Fatal(err)
	}
	var got struct {
		EarlyExits []string `json:"early_exits"`
		Notes      []string `json:"notes"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil || len(got.EarlyExits) != 1 || len(got.Notes) != 1 {
		t.Errorf("JSON early_exits %q, notes %q (%v)", got.EarlyExits, got.Notes, err)
	}
}

// Tasks run twice (a result lost with its connection) count once; the extra runs are
// told in the notes, per worker and in the JSON rather than silently dropped.
func TestRerunsReported(t *testing.T) {
	t.Parallel()
	r := seedResult(ModeRouting, 138, 0.0639)
	r.Worker.TasksRerun = 3
	w := r.Worker.Workers["bench-worker-1"]
	w.TasksRerun = 3
	r.Worker.Workers["bench-worker-1"] = w
	if n := strings.Join(Notes(r), " "); !strings.Contains(n, "3 task runs were repeated") {
		t.Errorf("notes %q, want the reruns", n)
	}
	var text, js bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "bench-worker-1: 1300 completed, 0 failed, 69 label misses, 3 runs lost (their tasks ran again)\n") {
		t.Errorf("per-worker line lacks the reruns:\n%s", text.String())
	}
	if err := WriteJSON(&js, r); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Worker struct {
			TasksRerun int `json:"tasks_rerun"`
			Workers    map[string]struct {
				TasksRerun int `json:"tasks_rerun"`
			} `json:"workers"`
		} `json:"worker"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil || got.Worker.TasksRerun != 3 || got.Worker.Workers["bench-worker-1"].TasksRerun != 3 {
		t.Errorf("JSON worker %+v (%v), want tasks_rerun 3", got.Worker, err)
	}
}

// Records the agents dropped and batches missing from the collector's files leave the
// worker counts short: the summary says so (notes, text, JSON) instead of nothing.
func TestLostLogRecordsReported(t *testing.T) {
	t.Parallel()
	log := `{"level":"warn","worker_id":"w1","component":"log_collector","event":"log_records_dropped","dropped":250,"dropped_total":250}
{"level":"warn","worker_id":"w1","component":"log_collector","event":"log_batches_missing","missing_from":3,"missing_to":7}
{"event":"task_completed","worker_id":"w1","task_id":"t1","attempt":1,"label":"a","label_miss":false,"run_ms":50,"total_ms":50,"ok":true}
`
	ws, err := workerlog.Summarize(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	r := Result{Mode: ModeRouting, Worker: ws, Producer: producer.Summarize([]producer.Record{{OK: true, Sync: true, Dispatched: true}})}
	if n := strings.Join(Notes(r), " "); !strings.Contains(n, "250 log records dropped") || !strings.Contains(n, "5 log batches missing") {
		t.Errorf("notes %q, want the lost records", n)
	}
	var text, js bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "w1: 1 completed, 0 failed, 0 label misses, 250 log records dropped, 5 log batches missing\n") {
		t.Errorf("per-worker line lacks the lost records:\n%s", text.String())
	}
	if err := WriteJSON(&js, r); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Worker struct {
			Dropped int `json:"log_records_dropped"`
			Missing int `json:"log_batches_missing"`
			Workers map[string]struct {
				Dropped int `json:"log_records_dropped"`
				Missing int `json:"log_batches_missing"`
			} `json:"workers"`
		} `json:"worker"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil || got.Worker.Dropped != 250 || got.Worker.Missing != 5 ||
		got.Worker.Workers["w1"].Dropped != 250 || got.Worker.Workers["w1"].Missing != 5 {
		t.Errorf("JSON worker %+v (%v), want 250 dropped and 5 missing, in all and for w1", got.Worker, err)
	}
}
