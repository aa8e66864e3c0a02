//go:build unix

package live

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smartroute/smartroute/batch"
	"github.com/smartroute/smartroute/benchmark/report"
)

// pidLog records the processes a run starts.
type pidLog struct {
	mu    sync.Mutex
	procs []string // "name pid"
	pids  []int
}

func (l *pidLog) started(p *process) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.procs = append(l.procs, fmt.Sprintf("%s %d", p.name, p.pid()))
	l.pids = append(l.pids, p.pid())
}

// assertAllGone checks that every process the run started is gone: they are our
// children and reaped, so no polling is needed.
func (l *pidLog) assertAllGone(t *testing.T, want int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pids) != want {
		t.Errorf("%d processes started (%v), want %d", len(l.pids), l.procs, want)
	}
	for i, pid := range l.pids {
		if !gone(pid) {
			t.Errorf("%s still runs", l.procs[i])
		}
	}
}

// e2eConfig is a small, fast run: 2 workers, 40 requests, at 2% of real time.
func e2eConfig(t *testing.T, binDir string, pids *pidLog) Config {
	cfg := DefaultConfig()
	cfg.BinDir = binDir
	cfg.OutDir = t.TempDir()
	cfg.NumWorkers = 2
	cfg.Requests = 40
	cfg.TimeScale = 0.02
	cfg.onProcessStart = pids.started
	return cfg
}

// TestEndToEnd runs the real dispatcher and worker agent. It builds them from this
// repository first and fails, not skips, when they do not build.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short: builds and runs the real dispatcher and worker agent")
	}
	t.Parallel()
	repo, err := FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	binDir := t.TempDir()
	if _, err := Build(t.Context(), repo, binDir); err != nil {
		t.Fatalf("the end-to-end test needs the dispatcher and the worker agent to build:\n%v", err)
	}

	t.Run("routing", func(t *testing.T) {
		t.Parallel()
		pids := &pidLog{}
		cfg := e2eConfig(t, binDir, pids)
		results, err := Measure(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		pids.assertAllGone(t, 2+cfg.NumWorkers) // the collector, the dispatcher and the agents
		if len(results) != 1 {
			t.Fatalf("%d results, want 1", len(results))
		}
		r := results[0]
		if r.Mode != report.ModeRouting {
			t.Errorf("mode %q", r.Mode)
		}
		ps, ws := r.Producer, r.Worker
		if ps.Requests != 40 || ps.Failed != 0 || ps.Sync != 40 || ps.Dispatched != 40 || ps.Completed != 40 {
			t.Errorf("producer summary: %+v", ps)
		}
		if ws.TasksCompleted != 40 || ws.TasksFailed != 0 {
			t.Errorf("worker logs: %d completed, %d failed, want 40 and 0", ws.TasksCompleted, ws.TasksFailed)
		}
		if len(ws.Workers) != cfg.NumWorkers {
			t.Errorf("worker logs name %d workers: %v", len(ws.Workers), ws.Workers)
		}
		// Every label used must have been loaded at least once, and the workers'
		// account of the misses must agree with the dispatcher's answers.
		labels := map[string]bool{}
		records := readRecords(t, filepath.Join(r.OutDir, recordsFile))
		for _, rec := range records {
			labels[rec["label"].(string)] = true
		}
		if len(records) != 40 {
			t.Errorf("%d records on disk, want 40", len(records))
		}
		if ws.LabelMisses < len(labels) || ws.LabelMisses > 40 {
			t.Errorf("%d label misses for %d labels used", ws.LabelMisses, len(labels))
		}
		if ws.LabelMisses != ps.LabelMisses {
			t.Errorf("worker logs count %d misses, the dispatcher's answers %d", ws.LabelMisses, ps.LabelMisses)
		}
		if ws.AvgTaskRuntime <= 0 || ps.Latency.P50 <= 0 || ps.Throughput <= 0 {
			t.Errorf("runtime %v, p50 %v, throughput %v: want all positive", ws.AvgTaskRuntime, ps.Latency.P50, ps.Throughput)
		}
		if notes := report.Notes(r); len(notes) > 0 {
			t.Errorf("notes: %q", notes)
		}
		if _, err := os.Stat(filepath.Join(r.OutDir, summaryFile)); err != nil {
			t.Error(err)
		}
	})

	t.Run("compare writes JSON and a chart", func(t *testing.T) {
		t.Parallel()
		pids := &pidLog{}
		cfg := e2eConfig(t, binDir, pids)
		cfg.Compare = true
		cfg.JSON = true
		chartDir := t.TempDir()
		cfg.ChartPath = filepath.Join(chartDir, "chart.svg")
		// The previous run's chart is replaced (renamed over), not left.
		if err := os.WriteFile(cfg.ChartPath, []byte("<svg>previous run</svg>"), 0o640); err != nil {
			t.Fatal(err)
		}
		var stdout bytes.Buffer
		if err := Run(t.Context(), cfg, &stdout); err != nil {
			t.Fatal(err)
		}
		pids.assertAllGone(t, 2*(2+cfg.NumWorkers))
		var got map[string]struct {
			Mode   string `json:"mode"`
			Worker struct {
				TasksCompleted int `json:"tasks_completed"`
			} `json:"worker"`
			Producer struct {
				Failed int `json:"failed"`
			} `json:"producer"`
		}
		dec := json.NewDecoder(&stdout)
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("stdout is not one JSON object: %v", err)
		}
		if dec.More() {
			t.Error("stdout holds more than the JSON object")
		}
		for _, mode := range []string{report.ModeRouting, report.ModeRandom} {
			if r := got[mode]; r.Mode != mode || r.Worker.TasksCompleted != 40 || r.Producer.Failed != 0 {
				t.Errorf("%s: %+v", mode, r)
			}
		}
		svg, err := os.ReadFile(cfg.ChartPath)
		if err != nil {
			t.Fatal(err)
		}
		var root struct{ XMLName xml.Name }
		if err := xml.Unmarshal(svg, &root); err != nil || root.XMLName.Local != "svg" || bytes.Contains(svg, []byte("previous run")) {
			t.Errorf("chart: root %v, err %v", root.XMLName, err)
		}
		if entries, err := os.ReadDir(chartDir); err != nil || len(entries) != 1 {
			t.Errorf("chart directory holds %v (%v), want only the chart", entries, err)
		}
		if fi, err := os.Stat(cfg.ChartPath); err != nil || fi.Mode().Perm() != 0o640 {
			t.Errorf("chart mode %v (%v), want the previous chart's 0640", fi.Mode(), err)
		}
	})

	t.Run("a reused --out counts only the latest run", func(t *testing.T) {
		t.Parallel()
		out := t.TempDir()
		for run := 1; run <= 2; run++ {
			cfg := e2eConfig(t, binDir, &pidLog{})
			cfg.OutDir, cfg.Requests = out, 20
			results, err := Measure(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			// The collector appends to the files it finds: the second run must not
			// count the first one's records.
			if ws, ps := results[0].Worker, results[0].Producer; ws.TasksCompleted != 20 || ws.LabelMisses != ps.LabelMisses {
				t.Errorf("run %d into one --out: workers %d completed, %d misses; dispatcher's answers %d misses",
					run, ws.TasksCompleted, ws.LabelMisses, ps.LabelMisses)
			}
		}
	})

	t.Run("an unwritable chart path is refused before anything starts", func(t *testing.T) {
		t.Parallel()
		pids := &pidLog{}
		cfg := e2eConfig(t, binDir, pids)
		cfg.Compare = true
		cfg.ChartPath = filepath.Join(t.TempDir(), "no-such-dir", "chart.svg")
		err := Run(t.Context(), cfg, io.Discard)
		pids.mu.Lock()
		started := len(pids.pids)
		pids.mu.Unlock()
		// ErrConfig: the command exits 2, as for any other bad flag.
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--chart") || started != 0 {
			t.Errorf("err %v after %d processes started; want a --chart ErrConfig before any", err, started)
		}
	})

	t.Run("a run in which no task completed fails after printing its summary", func(t *testing.T) {
		t.Parallel()
		pids := &pidLog{}
		cfg := e2eConfig(t, binDir, pids)
		cfg.Requests = 4
		cfg.RequestTimeout = time.Nanosecond // every request fails before it is answered
		var stdout bytes.Buffer
		err := Run(t.Context(), cfg, &stdout)
		pids.assertAllGone(t, 2+cfg.NumWorkers)
		if err == nil || !strings.Contains(err.Error(), "routing: no task completed: all 4 requests failed") || errors.Is(err, ErrConfig) {
			t.Errorf("err = %v; want a run error saying no task completed", err)
		}
		if !strings.Contains(stdout.String(), "Producer Log Summary") {
			t.Errorf("no summary printed:\n%s", stdout.String())
		}
	})

	t.Run("a process that dies during the run fails it after printing its summary", func(t *testing.T) {
		t.Parallel()
		pids := &pidLog{}
		cfg := e2eConfig(t, binDir, pids)
		victim := agentID(cfg.NumWorkers)
		var agent *process // written before the producers start, by startCluster's goroutine
		cfg.onProcessStart = func(p *process) {
			pids.started(p)
			if p.name == victim {
				agent = p
			}
		}
		var once sync.Once
		cfg.Progress = writerFunc(func(p []byte) (int, error) {
			// The first redraw, or the last one once the producers are done: either way
			// before the cluster is stopped. The agent is gone (reaped) on return.
			once.Do(func() {
				agent.cmd.Process.Kill()
				<-agent.done
			})
			return len(p), nil
		})
		var stdout bytes.Buffer
		err := Run(t.Context(), cfg, &stdout)
		pids.assertAllGone(t, 2+cfg.NumWorkers)
		want := "routing: " + victim + " exited by itself before it was stopped (signal: killed"
		if err == nil || !strings.Contains(err.Error(), want) || errors.Is(err, ErrConfig) {
			t.Errorf("err = %v; want a run error saying %q", err, want)
		}
		if out := stdout.String(); !strings.Contains(out, "Producer Log Summary") || !strings.Contains(out, "Note: "+victim+" exited by itself") {
			t.Errorf("want the summary with a note of the lost agent:\n%s", out)
		}
	})

	t.Run("batch-compare", func(t *testing.T) {
		t.Parallel()
		pids := &pidLog{}
		bc := BatchCompareConfig{Cluster: e2eConfig(t, binDir, pids), Input: batchInput(t, 30)}
		var stdout bytes.Buffer
		if err := BatchCompare(t.Context(), bc, &stdout); err != nil {
			t.Fatal(err)
		}
		pids.assertAllGone(t, 2*(2+bc.Cluster.NumWorkers)) // one cluster per order
		out := stdout.String()
		// Each order ran all 30 lines, none rejected, and the agents' logs count as many
		// loads as the dispatcher's answers.
		for _, order := range []string{"label", "file"} {
			row := regexp.MustCompile(`(?m)^ *` + order + ` +30 +30 +0 +(\d+) +(\d+) `).FindStringSubmatch(out)
			if row == nil || row[1] != row[2] || row[1] == "0" {
				t.Errorf("no row for order %s with 30 lines done and the loads agreeing:\n%s", order, out)
			}
		}
		if strings.Contains(out, "Note:") {
			t.Errorf("notes on a clean run:\n%s", out)
		}
	})

	t.Run("batch-compare fails after its table when a process dies", func(t *testing.T) {
		t.Parallel()
		pids := &pidLog{}
		bc := BatchCompareConfig{Cluster: e2eConfig(t, binDir, pids), Input: batchInput(t, 30), Orders: []batch.Order{batch.OrderLabel}}
		victim := agentID(bc.Cluster.NumWorkers)
		var agent *process // written before the job starts, by startCluster's goroutine
		bc.Cluster.onProcessStart = func(p *process) {
			pids.started(p)
			if p.name == victim {
				agent = p
			}
		}
		var once sync.Once
		bc.Cluster.Progress = writerFunc(func(p []byte) (int, error) {
			once.Do(func() { // the job's first redraw: before the cluster is stopped
				agent.cmd.Process.Kill()
				<-agent.done
			})
			return len(p), nil
		})
		var stdout bytes.Buffer
		err := BatchCompare(t.Context(), bc, &stdout)
		pids.assertAllGone(t, 2+bc.Cluster.NumWorkers)
		want := "label order: " + victim + " exited by itself before it was stopped (signal: killed"
		if err == nil || !strings.Contains(err.Error(), want) || errors.Is(err, ErrConfig) {
			t.Errorf("err = %v; want a run error saying %q", err, want)
		}
		if out := stdout.String(); !strings.Contains(out, "label loads (agents)") || !strings.Contains(out, "Note: "+want) {
			t.Errorf("want the table with a note of the lost agent:\n%s", out)
		}
	})

	t.Run("triton backend", func(t *testing.T) {
		t.Parallel()
		pids := &pidLog{}
		cfg := e2eConfig(t, binDir, pids)
		cfg.Backend = BackendTriton
		results, err := Measure(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		// The collector, the dispatcher, and each agent with its fake Triton.
		pids.assertAllGone(t, 2+2*cfg.NumWorkers)
		ps, ws := results[0].Producer, results[0].Worker
		if ps.Requests != 40 || ps.Failed != 0 || ps.Completed != 40 || ws.TasksCompleted != 40 {
			t.Errorf("producer summary %+v; workers completed %d", ps, ws.TasksCompleted)
		}
		// Real loads happened on the fakes, and the agents' account agrees with the
		// dispatcher's answers.
		if ws.LabelMisses < 1 || ws.LabelMisses != ps.LabelMisses {
			t.Errorf("label misses: workers %d, dispatcher %d", ws.LabelMisses, ps.LabelMisses)
		}
		for _, rec := range readRecords(t, filepath.Join(results[0].OutDir, recordsFile)) {
			if rec["task_type"] != "infer" {
				t.Fatalf("record %v: want infer tasks for the Triton backend", rec)
			}
		}
	})

	t.Run("interrupted during startup", func(t *testing.T) {
		t.Parallel()
		pids := &pidLog{}
		cfg := e2eConfig(t, binDir, pids)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		cfg.onProcessStart = func(p *process) {
			pids.started(p)
			if p.name == agentID(cfg.NumWorkers) {
				cancel() // Ctrl-C while the workers connect
			}
		}
		_, err := Measure(ctx, cfg)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		pids.assertAllGone(t, 2+cfg.NumWorkers) // the collector, the dispatcher and the agents
	})

	t.Run("interrupted during the requests", func(t *testing.T) {
		t.Parallel()
		pids := &pidLog{}
		cfg := e2eConfig(t, binDir, pids)
		cfg.Requests = 5000 // far longer than the first progress redraw
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		cfg.Progress = writerFunc(func(p []byte) (int, error) {
			cancel() // Ctrl-C once the producers run
			return len(p), nil
		})
		_, err := Measure(ctx, cfg)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		pids.assertAllGone(t, 2+cfg.NumWorkers) // the collector, the dispatcher and the agents
	})
}

// batchInput writes a batch job's input of n tasks over three labels.
func batchInput(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, `{"id":%d,"label":"label-%d","task_type":"sample_task","parameters":{"n":%d}}`+"\n", i, i%3+1, i)
	}
	path := filepath.Join(t.TempDir(), "input.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func readRecords(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, m)
	}
	return out
}
