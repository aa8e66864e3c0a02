package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A second task for a label goes to the worker that loaded it, with no load.
func TestAffinity(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOpts{workers: 2, loadTime: 50 * time.Millisecond, runTime: 5 * time.Millisecond})
	code, first := s.run(task("aff-1", "model-a", ""))
	if code != 200 || first.Status != "completed" || !first.LabelMiss {
		t.Fatalf("first task: %d %+v", code, first)
	}
	for i := 2; i <= 5; i++ {
		code, next := s.run(task(fmt.Sprintf("aff-%d", i), "model-a", ""))
		if code != 200 || next.WorkerID != first.WorkerID || next.LabelMiss {
			t.Fatalf("task %d: %d %+v, want %s without a load", i, code, next, first.WorkerID)
		}
	}
	var labels map[string][]string
	s.getJSON("/labels", &labels)
	if len(labels["model-a"]) != 1 || labels["model-a"][0] != first.WorkerID {
		t.Fatalf("/labels = %v", labels)
	}
	// The agent logged its one label miss and five completed tasks.
	agent := s.agents[first.WorkerID]
	if n := grepLog(t, agent, `"event":"label_miss"`, `"label":"model-a"`); n != 1 {
		t.Fatalf("agent logged %d label misses, want 1", n)
	}
	// The agent logs a task after sending its result, so the last record may trail the
	// answer.
	s.eventually("the agent logged five completed tasks", func() bool { return grepLog(t, agent, `"event":"task_completed"`) >= 5 })
	if n := grepLog(t, agent, `"event":"task_completed"`); n != 5 {
		t.Fatalf("agent logged %d completed tasks, want 5", n)
	}
}

// Random mode spreads tasks over the free workers whatever they hold.
func TestRandomMode(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOpts{workers: 2, random: true, loadTime: time.Millisecond, runTime: time.Millisecond})
	seen := map[string]int{}
	for i := 0; i < 30; i++ {
		code, a := s.run(task(fmt.Sprintf("rnd-%d", i), "model-a", ""))
		if code != 200 {
			t.Fatalf("task %d: %d %+v", i, code, a)
		}
		seen[a.WorkerID]++
	}
	if len(seen) != 2 {
		t.Fatalf("30 random-mode tasks all went to %v; want both workers used", seen)
	}
}

// An async task answers 202 at once and its result is fetched later.
func TestAsyncThenGet(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOpts{workers: 1, loadTime: 10 * time.Millisecond, runTime: 10 * time.Millisecond})
	code, a := s.run(task("async-1", "model-a", `"return_result": false`))
	if code != 202 || a.TaskID != "async-1" {
		t.Fatalf("async submit: %d %+v", code, a)
	}
	var got taskAnswer
	s.eventually("async task completed", func() bool {
		return s.getJSON("/tasks/async-1", &got) == 200 && got.Status == "completed"
	})
	if !strings.Contains(string(got.Result), "async-1") {
		t.Fatalf("result %s does not echo the task", got.Result)
	}
}

// A task whose deadline passes while it runs gets 504 from the worker's cancellation.
// The task would run an hour: a 504 that is the worker's failed result (not the
// dispatcher's answer for a worker that overran the deadline by a grace period without
// a word) means the worker stopped at the deadline, however long it took to say so.
func TestDeadlineWhileRunning(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOpts{workers: 1, loadTime: time.Millisecond, runTime: time.Hour})
	code, a := s.run(task("late-1", "model-a", `"timeout_ms": 300`))
	if code != 504 || a.TaskID != "late-1" || a.Status != "failed" || !strings.HasPrefix(a.Error, "deadline exceeded while running") {
		t.Fatalf("want 504 with the worker's deadline failure, got %d %+v", code, a)
	}
}

// An agent killed mid-task: the task runs on another agent and the producer gets one
// answer.
func TestAgentKilledMidTask(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOpts{workers: 2, loadTime: 10 * time.Millisecond, runTime: 2 * time.Second})
	type answer struct {
		code int
		a    taskAnswer
		err  error
	}
	answers := make(chan answer, 1)
	go func() {
		code, a, err := s.post(task("kill-1", "model-a", ""))
		answers <- answer{code, a, err}
	}()
	var running taskAnswer
	s.eventually("task running", func() bool {
		return s.getJSON("/tasks/kill-1", &running) == 200 && running.Status == "running"
	})
	victim := s.agents[running.WorkerID]
	victim.signal(t, syscall.SIGKILL)
	victim.wait(t, 10*time.Second)
	got := <-answers
	if got.err != nil {
		t.Fatal(got.err)
	}
	if code, a := got.code, got.a; code != 200 || a.Status != "completed" || a.Attempts != 2 || a.WorkerID == running.WorkerID {
		t.Fatalf("after the kill: %d %+v (first ran on %s)", code, a, running.WorkerID)
	}
	// The one answer is the task's: the dispatcher's record says the same. (A second
	// answer on the channel could not happen: the goroutine sends once.)
	var stored taskAnswer
	if code := s.getJSON("/tasks/kill-1", &stored); code != 200 || stored.Status != "completed" || stored.Attempts != 2 || stored.WorkerID != got.a.WorkerID {
		t.Fatalf("the dispatcher's record %d %+v differs from the answer %+v", code, stored, got.a)
	}
	s.eventually("killed agent gone from /workers", func() bool { return len(s.workers()) == 1 })
}

// The dispatcher shuts down on SIGTERM, letting an in-flight task finish; the agents
// reconnect to a new dispatcher on the same address and serve again.
func TestDispatcherRestartAgentsReconnect(t *testing.T) {
	t.Parallel()
	o := stackOpts{workers: 2, loadTime: 10 * time.Millisecond, runTime: 500 * time.Millisecond}
	s := startStack(t, o)
	done := make(chan error, 1)
	go func() {
		code, a, err := s.post(task("inflight-1", "model-a", ""))
		if err == nil && code != 200 {
			err = fmt.Errorf("in-flight task during shutdown answered %d %+v", code, a)
		}
		done <- err
	}()
	var running taskAnswer
	s.eventually("task running", func() bool {
		return s.getJSON("/tasks/inflight-1", &running) == 200 && running.Status == "running"
	})
	s.disp.signal(t, syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := s.disp.wait(t, 15*time.Second); err != nil {
		t.Fatalf("dispatcher exit: %v", err)
	}
	s.startDispatcher(o)
	s.waitWorkers(2)
	if code, a := s.run(task("after-restart", "model-a", "")); code != 200 {
		t.Fatalf("after restart: %d %+v", code, a)
	}
	for id, p := range s.agents {
		select {
		case <-p.done:
			t.Fatalf("agent %s exited: %v", id, p.err)
		default:
		}
	}
}

// Bad input is refused with a clear error and leaves the stack serving.
func TestBadInputLeavesStackServing(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOpts{workers: 1, loadTime: time.Millisecond, runTime: time.Millisecond})
	for _, body := range []string{`{"label":`, `{"task_type":"x"}`, `{"task_type":"x","label":"m","nope":1}`} {
		if code, a := s.run(body); code != 400 || a.Error == "" {
			t.Fatalf("%s: %d %+v", body, code, a)
		}
	}
	if code, _ := s.run(task("fine", "m", "")); code != 200 {
		t.Fatalf("good task after bad ones: %d", code)
	}
}

// One agent process can host several agents (load and scale tests); each is a worker
// of its own to the dispatcher.
func TestAgentsInOneProcess(t *testing.T) {
	t.Parallel()
	s := startStack(t, stackOpts{workers: 0, loadTime: time.Millisecond, runTime: time.Millisecond})
	start(t, "worker-agent#many", "--dispatcher-url", "ws://"+s.addr+"/worker-listen", "--worker-id", "many", "--agents", "3")
	s.waitWorkers(3)
	if got := strings.Join(s.workers(), ","); got != "many-1,many-2,many-3" {
		t.Fatalf("workers %s", got)
	}
	for i := 0; i < 6; i++ {
		if code, a := s.run(task(fmt.Sprintf("many-%d", i), fmt.Sprintf("l%d", i%3), "")); code != 200 {
			t.Fatalf("task %d: %d %+v", i, code, a)
		}
	}
}
