package e2e

// The fault-injection suite: real processes killed with SIGKILL under load. Counts
// default to the figures; FAULT_AGENT_KILLS and FAULT_JOURNAL_TASKS change
// them (README, "Tests").

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// postTask sends one task and returns the status and the answer; it does not fail the
// test, so producer goroutines can use it.
func postTask(ctx context.Context, addr, body string) (int, taskAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/run-task", strings.NewReader(body))
	if err != nil {
		return 0, taskAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, taskAnswer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, taskAnswer{}, err
	}
	var a taskAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		return resp.StatusCode, a, fmt.Errorf("answer is not JSON: %q", raw)
	}
	return resp.StatusCode, a, nil
}

// completedRuns counts, per task id, the task_completed records in the agents' logs:
// how many times a worker ran the task and delivered its result.
func completedRuns(t *testing.T, agents []*proc) map[string]int {
	t.Helper()
	runs := map[string]int{}
	for _, p := range agents {
		b, err := os.ReadFile(p.log)
		if err != nil {
			t.Fatal(err)
		}
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			if !bytes.Contains(line, []byte(`"event":"task_completed"`)) {
				continue
			}
			var rec struct {
				TaskID string `json:"task_id"`
			}
			if json.Unmarshal(line, &rec) == nil && rec.TaskID != "" {
				runs[rec.TaskID]++
			}
		}
	}
	return runs
}

// Agents are killed with SIGKILL at random moments while producers keep tasks
// running, and restarted: every task gets exactly one answer, a success, and the
// dispatcher's record agrees with it.
func TestFaultAgentKills(t *testing.T) {
	t.Parallel()
	kills := envInt(t, "FAULT_AGENT_KILLS", 50)
	o := stackOpts{workers: 4, loadTime: 5 * time.Millisecond, runTime: 20 * time.Millisecond,
		dispatcherArgs: []string{"--max-attempts", "10"}}
	s := startStack(t, o)
	var allAgents []*proc
	for _, p := range s.agents {
		allAgents = append(allAgents, p)
	}

	type result struct {
		code int
		a    taskAnswer
		err  error
	}
	var mu sync.Mutex
	answers := map[string]result{} // each id is one request: one answer by construction
	stop := make(chan struct{})
	var producers sync.WaitGroup
	for g := range 8 {
		producers.Add(1)
		go func() {
			defer producers.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("kill-%d-%d", g, i)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				code, a, err := postTask(ctx, s.addr, task(id, fmt.Sprintf("model-%d", (g+i)%6), ""))
				cancel()
				mu.Lock()
				answers[id] = result{code, a, err}
				mu.Unlock()
			}
		}()
	}

	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	ids := []string{"agent-1", "agent-2", "agent-3", "agent-4"}
	for k := 0; k < kills; k++ {
		// A random moment: between 20ms and 150ms after the last restart.
		<-time.After(time.Duration(20+r.IntN(130)) * time.Millisecond)
		id := ids[r.IntN(len(ids))]
		victim := s.agents[id]
		victim.signal(t, syscall.SIGKILL)
		_ = victim.wait(t, 10*time.Second)
		s.startAgent(id, o)
		allAgents = append(allAgents, s.agents[id])
	}
	close(stop)
	producers.Wait()

	runs := completedRuns(t, allAgents)
	twice, total, rerun := 0, 0, 0
	for id, res := range answers {
		total++
		if res.err != nil || res.code != 200 || res.a.Status != "completed" || res.a.TaskID != id {
			t.Fatalf("task %s: %d %+v %v", id, res.code, res.a, res.err)
		}
		var stored taskAnswer
		if code := s.getJSON("/tasks/"+id, &stored); code != 200 || stored.Status != "completed" || stored.Attempts != res.a.Attempts {
			t.Fatalf("task %s: the dispatcher's record %d %+v differs from its answer %+v", id, code, stored, res.a)
		}
		if runs[id] > 1 {
			twice++
		}
		if res.a.Attempts > 1 {
			rerun++
		}
	}
	// One answer per task on the dispatcher's side: each id is one request of one
	// producer, so a count of the producers' answers cannot tell; a task finished twice
	// (a killed worker's attempt and its re-run both taken) would be counted twice.
	_, metrics := scrape("http://" + s.addr + "/metrics")
	if got := sumMetric(metrics, "smartroute_dispatcher_tasks_completed_total"); got != float64(total) {
		t.Fatalf("the dispatcher counts %v tasks completed; the producers sent %d, each answered completed", got, total)
	}
	stale := grepLog(t, s.disp, `"stale result dropped"`)
	t.Logf("%d agent kills, %d tasks, each answered once; %d re-run after a kill, %d ran to completion on more than one worker (at-least-once execution), %d stale results dropped",
		kills, total, rerun, twice, stale)
	if total < kills {
		t.Fatalf("only %d tasks ran during %d kills: the load did not overlap the faults", total, kills)
	}
	if rerun == 0 {
		t.Fatalf("no task was re-run (attempts > 1) in %d kills: no kill caught a task running, and the test exercised no fault", kills)
	}
}

// sumMetric adds up a counter's samples over its labels in a Prometheus text page.
func sumMetric(page, name string) float64 {
	sum := 0.0
	for line := range strings.SplitSeq(page, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		if i := strings.LastIndexByte(rest, ' '); i >= 0 {
			if v, err := strconv.ParseFloat(rest[i+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// The dispatcher is killed with SIGKILL while the journal holds many asynchronous
// tasks; a new dispatcher on the same data dir runs them all: each ends with exactly
// one answer, and resubmitting an answered id runs nothing again.
func TestFaultDispatcherCrashWithJournaledTasks(t *testing.T) {
	t.Parallel()
	n := envInt(t, "FAULT_JOURNAL_TASKS", 1000)
	o := stackOpts{workers: 4, loadTime: 5 * time.Millisecond, runTime: 10 * time.Millisecond}
	s := startStack(t, o)
	agents := []*proc{s.agents["agent-1"], s.agents["agent-2"], s.agents["agent-3"], s.agents["agent-4"]}

	ids := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			failed := false
			for i := range ids {
				if failed {
					// Drained, not left: once every producer had failed and returned,
					// the loop below blocked on ids until the test binary's -timeout
					// instead of reporting the error.
					continue
				}
				id := fmt.Sprintf("journal-%d", i)
				code, a, err := s.post(task(id, fmt.Sprintf("model-%d", i%8), `"return_result":false`))
				if err == nil && (code != 202 || a.TaskID != id) {
					err = fmt.Errorf("task %s: %d %+v", id, code, a)
				}
				if err != nil {
					errs <- err
					failed = true
				}
			}
		}()
	}
	for i := range n {
		ids <- i
	}
	close(ids)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s.disp.signal(t, syscall.SIGKILL) // every 202 was answered: all n are journaled
	_ = s.disp.wait(t, 10*time.Second)
	runsBefore := completedRuns(t, agents)

	s.startDispatcher(o)
	requeued := journalRequeued(t, s.disp)
	if requeued == 0 {
		t.Fatalf("no task was pending at the kill (%d ran before it): the test did not exercise recovery", len(runsBefore))
	}
	pending := map[string]bool{}
	for i := range n {
		pending[fmt.Sprintf("journal-%d", i)] = true
	}
	answers := map[string]taskAnswer{}
	deadline := time.Now().Add(60 * time.Second)
	for len(pending) > 0 {
		for id := range pending {
			var a taskAnswer
			if code := s.getJSON("/tasks/"+id, &a); code != 200 {
				t.Fatalf("task %s unknown after the restart: %d", id, code)
			}
			if a.Status == "completed" || a.Status == "failed" {
				answers[id] = a
				delete(pending, id)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d journaled tasks never finished after the restart", len(pending), n)
		}
		time.Sleep(50 * time.Millisecond) // polling an observable state
	}
	for id, a := range answers {
		if a.Status != "completed" {
			t.Fatalf("task %s: %+v", id, a)
		}
	}
	runs := completedRuns(t, agents)
	twice := 0
	for _, c := range runs {
		if c > 1 {
			twice++
		}
	}
	// One final answer: resubmitting answered ids (the same tasks) returns the stored
	// answer and runs nothing, so the agents' records do not change; the id reused for
	// another task (another label) is refused with 409, journaled fingerprint and all.
	for i := range 20 {
		id := fmt.Sprintf("journal-%d", i*(n/20))
		label := fmt.Sprintf("model-%d", i*(n/20)%8)
		code, a, err := postTask(context.Background(), s.addr, task(id, label, ""))
		if err != nil || code != 200 || a.Status != "completed" || string(a.Result) != string(answers[id].Result) {
			t.Fatalf("resubmitted %s: %d %+v %v, first answer %+v", id, code, a, err, answers[id])
		}
		code, a, err = postTask(context.Background(), s.addr, task(id, label+"-other", ""))
		if err != nil || code != 409 {
			t.Fatalf("%s resubmitted for another label: %d %+v %v, want 409", id, code, a, err)
		}
	}
	if after := completedRuns(t, agents); !maps.Equal(after, runs) {
		t.Fatal("resubmitting answered tasks ran them again")
	}
	t.Logf("%d tasks journaled; %d ran before the kill, %d pending re-run after the restart; all %d completed once; %d ran on workers twice (running at the kill: at-least-once execution)",
		n, len(runsBefore), requeued, n, twice)
}

// journalRequeued reads how many pending tasks a dispatcher took over from its journal.
func journalRequeued(t *testing.T, disp *proc) int {
	t.Helper()
	var rec struct {
		Requeued int `json:"requeued"`
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(disp.log)
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			if bytes.Contains(line, []byte(`"journal opened"`)) && json.Unmarshal(line, &rec) == nil {
				return rec.Requeued
			}
		}
		time.Sleep(10 * time.Millisecond) // polling the log file
	}
	t.Fatal("the dispatcher never logged opening its journal")
	return 0
}

type workerLabels struct {
	Workers []struct {
		ID     string   `json:"id"`
		Labels []string `json:"labels"`
	} `json:"workers"`
}

func (s *stack) labelView() map[string]string {
	var v workerLabels
	if s.getJSON("/workers?detail=true", &v) != 200 {
		return nil
	}
	out := map[string]string{}
	for _, w := range v.Workers {
		l := slices.Clone(w.Labels)
		slices.Sort(l)
		out[w.ID] = strings.Join(l, ",")
	}
	return out
}

// 100 agents in one process hold labels; the dispatcher is killed and started again:
// the agents reconnect (backoff with jitter) and announce their labels, and the new
// dispatcher's view equals the old one. The time it takes is logged (README and
// benchmark/RESULTS.md quote it).
func TestReconnect100AgentsAfterRestart(t *testing.T) {
	t.Parallel()
	const agents = 100
	o := stackOpts{loadTime: time.Millisecond, runTime: time.Millisecond}
	s := startStack(t, o)
	start(t, "worker-agent#fleet", "--dispatcher-url", "ws://"+s.addr+"/worker-listen", "--worker-id", "fleet",
		"--agents", strconv.Itoa(agents), "--max-labels", "2", "--sim-load-time", "1ms", "--sim-run-time", "1ms", "--log-level", "warn")
	s.waitWorkers(agents)
	// Spread labels over the fleet: 300 tasks over 150 labels.
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				postTask(context.Background(), s.addr, task(fmt.Sprintf("spread-%d-%d", g, i), fmt.Sprintf("label-%d", (g*30+i)%150), ""))
			}
		}()
	}
	wg.Wait()
	before := s.labelView()
	holding := 0
	for _, l := range before {
		if l != "" {
			holding++
		}
	}
	if len(before) != agents || holding < agents/2 {
		t.Fatalf("before the restart: %d workers, %d holding labels", len(before), holding)
	}

	s.disp.signal(t, syscall.SIGKILL)
	_ = s.disp.wait(t, 10*time.Second)
	killed := time.Now()
	s.startDispatcher(o) // returns once /health answers
	healthy := time.Now()
	var after map[string]string
	s.eventually("the new dispatcher's view equals the old one", func() bool {
		after = s.labelView()
		return len(after) == agents && maps.Equal(after, before)
	})
	whole := time.Now()
	t.Logf("%d agents (%d holding labels): view whole %.0f ms after the new dispatcher answered /health (%.0f ms after the kill)",
		agents, holding, float64(whole.Sub(healthy).Microseconds())/1000, float64(whole.Sub(killed).Microseconds())/1000)
}
