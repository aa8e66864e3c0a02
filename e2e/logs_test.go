package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startCollector starts the log-collector binary on addr with dir and waits for /health.
// startCollector starts a log collector on addr, or, when addr is "", on a port of its
// choosing; it returns the collector and its address.
func startCollector(t *testing.T, s *stack, name, addr, dir string) (*proc, string) {
	t.Helper()
	listen := addr
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	p := start(t, "log-collector#"+name, "--addr", listen, "--dir", dir, "--log-level", "debug")
	if addr == "" {
		addr = loggedAddr(t, p, jsonAddr("log collector listening"))
	}
	s.eventually("log collector healthy", func() bool {
		resp, err := http.Get("http://" + addr + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return p, addr
}

// collectorLines returns the records the collector holds for worker, oldest first.
func collectorLines(t *testing.T, dir, worker string) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, worker, "*.jsonl"))
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.SplitSeq(string(b), "\n") {
			if l != "" {
				out = append(out, l)
			}
		}
	}
	return out
}

func countWith(lines []string, fragments ...string) int {
	n := 0
	for _, l := range lines {
		ok := true
		for _, f := range fragments {
			ok = ok && strings.Contains(l, f)
		}
		if ok {
			n++
		}
	}
	return n
}

// Two agents stream their logs to the real collector: it holds each agent's label-miss
// and task-completed records, the same ones the agents print, and /logs finds them.
func TestLogCollectorHoldsAgentRecords(t *testing.T) {
	t.Parallel()
	o := stackOpts{workers: 2, loadTime: 20 * time.Millisecond, runTime: 300 * time.Millisecond}
	s := &stack{t: t, agents: map[string]*proc{}}
	dir := t.TempDir()
	_, collAddr := startCollector(t, s, "1", "", dir)
	s.startDispatcher(o)
	for _, id := range []string{"agent-1", "agent-2"} {
		s.agents[id] = start(t, "worker-agent#"+id, "--dispatcher-url", "ws://"+s.addr+"/worker-listen", "--worker-id", id,
			"--max-labels", "2", "--sim-load-time", o.loadTime.String(), "--sim-run-time", o.runTime.String(),
			"--log-collector-url", "ws://"+collAddr+"/ingest")
	}
	s.waitWorkers(2)

	// Two labels at once: both workers busy, each loads one.
	var wg sync.WaitGroup
	workers := make([]string, 2)
	for i, label := range []string{"model-a", "model-b"} {
		wg.Go(func() {
			code, a := s.run(task(fmt.Sprintf("logs-%d", i), label, ""))
			if code != 200 || !a.LabelMiss {
				t.Errorf("task for %s: %d %+v", label, code, a)
			}
			workers[i] = a.WorkerID
		})
	}
	wg.Wait()
	if workers[0] == workers[1] {
		t.Fatalf("both first tasks ran on %s; want one per worker", workers[0])
	}
	for i := 2; i < 6; i++ {
		if code, a := s.run(task(fmt.Sprintf("logs-%d", i), []string{"model-a", "model-b"}[i%2], "")); code != 200 {
			t.Fatalf("task %d: %d %+v", i, code, a)
		}
	}
	// SIGTERM: the agents drain and flush their logs before exiting.
	for _, id := range []string{"agent-1", "agent-2"} {
		s.agents[id].signal(t, syscall.SIGTERM)
	}
	for _, id := range []string{"agent-1", "agent-2"} {
		if err := s.agents[id].wait(t, 20*time.Second); err != nil {
			t.Fatalf("%s exited with %v", id, err)
		}
	}
	total := 0
	for _, id := range []string{"agent-1", "agent-2"} {
		held := collectorLines(t, dir, id)
		misses, done := grepLog(t, s.agents[id], `"event":"label_miss"`), grepLog(t, s.agents[id], `"event":"task_completed"`)
		if misses < 1 || done < 1 {
			t.Fatalf("%s printed %d label misses and %d completed tasks; want some of each", id, misses, done)
		}
		if got := countWith(held, `"event":"label_miss"`, `"worker_id":"`+id+`"`); got != misses {
			t.Errorf("collector holds %d label_miss records of %s, the agent printed %d", got, id, misses)
		}
		if got := countWith(held, `"event":"task_completed"`, `"worker_id":"`+id+`"`); got != done {
			t.Errorf("collector holds %d task_completed records of %s, the agent printed %d", got, id, done)
		}
		if countWith(held, `"message":"worker agent stopped"`) != 1 {
			t.Errorf("the collector lacks %s's last record (flushed on exit)", id)
		}
		total += done
	}
	if total != 6 {
		t.Fatalf("%d tasks completed in the agents' logs, want 6", total)
	}
	// The query API finds the same records.
	resp, err := http.Get("http://" + collAddr + "/logs?event=task_completed&level=info")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Records []struct {
			WorkerID string `json:"worker_id"`
			TaskID   string `json:"task_id"`
		} `json:"records"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 || len(body.Records) != 6 {
		t.Fatalf("GET /logs: %d, %d records, %v", resp.StatusCode, len(body.Records), err)
	}
}

// The collector is killed with SIGKILL while an agent streams to it, and started again
// on the same directory: every record the agent printed is in the files exactly once.
func TestLogCollectorKilledMidStream(t *testing.T) {
	t.Parallel()
	o := stackOpts{workers: 1, loadTime: time.Millisecond, runTime: time.Millisecond}
	s := &stack{t: t, agents: map[string]*proc{}}
	dir := t.TempDir()
	coll, collAddr := startCollector(t, s, "1", "", dir)
	s.startDispatcher(o)
	s.agents["agent-1"] = start(t, "worker-agent#agent-1", "--dispatcher-url", "ws://"+s.addr+"/worker-listen",
		"--worker-id", "agent-1", "--log-level", "debug", "--sim-load-time", "1ms", "--sim-run-time", "1ms",
		"--log-collector-url", "ws://"+collAddr+"/ingest")
	s.waitWorkers(1)
	runSome := func(prefix string, n int) {
		for i := range n {
			if code, a := s.run(task(fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("model-%d", i%3), "")); code != 200 {
				t.Fatalf("task %s-%d: %d %+v", prefix, i, code, a)
			}
		}
	}
	runSome("before", 40)
	coll.signal(t, syscall.SIGKILL)
	_ = coll.wait(t, 10*time.Second)
	runSome("while-down", 40)
	startCollector(t, s, "2", collAddr, dir) // where the agent reconnects
	runSome("after", 40)
	s.agents["agent-1"].signal(t, syscall.SIGTERM)
	if err := s.agents["agent-1"].wait(t, 20*time.Second); err != nil {
		t.Fatalf("agent exited with %v", err)
	}

	printed, err := os.ReadFile(s.agents["agent-1"].log)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for l := range strings.SplitSeq(string(printed), "\n") {
		// The shipper's own records go to stdout only.
		if strings.HasPrefix(l, "{") && !strings.Contains(l, `"component":"logship"`) {
			want = append(want, l)
		}
	}
	var got []string
	for _, l := range collectorLines(t, dir, "agent-1") {
		if !strings.Contains(l, `"component":"log_collector"`) { // notes the collector adds
			got = append(got, l)
		}
	}
	if countWith(got, `"task_id":"while-down-`) == 0 {
		t.Fatal("no record from while the collector was down reached it")
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(want, got) {
		missing, extra := diff(want, got), diff(got, want)
		t.Fatalf("collector holds %d records, the agent printed %d; missing %d %q, extra %d %q",
			len(got), len(want), len(missing), head(missing), len(extra), head(extra))
	}
}

// diff returns the elements of sorted a not matched one for one in sorted b.
func diff(a, b []string) []string {
	var out []string
	j := 0
	for _, x := range a {
		for j < len(b) && b[j] < x {
			j++
		}
		if j < len(b) && b[j] == x {
			j++
			continue
		}
		out = append(out, x)
	}
	return out
}

func head(s []string) []string { return s[:min(len(s), 3)] }
