package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

// taskBody is a /run-task body; params is the parameters_json value as written.
func taskBody(id, taskType, label, params string, async bool) string {
	s := fmt.Sprintf(`{"task_id":%q,"task_type":%q,"label":%q`, id, taskType, label)
	if params != "" {
		s += `,"parameters_json":` + params
	}
	if async {
		s += `,"return_result":false`
	}
	return s + "}"
}

// activeTasks is how many tasks the hub has in flight.
func (b *bundle) activeTasks() int {
	b.d.hub.mu.Lock()
	defer b.d.hub.mu.Unlock()
	return len(b.d.hub.active)
}

// sendWithin is send bounded by within (a failure bound: a resubmission attached to
// a task no worker runs would wait for its deadline); status 0 when it ran out.
func (b *bundle) sendWithin(within time.Duration, method, path, body string) (int, http.Header, map[string]any) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, b.srv.URL+path, strings.NewReader(body))
	if err != nil {
		b.t.Fatal(err)
	}
	resp, err := b.client().Do(req)
	if err != nil {
		return 0, nil, map[string]any{"transport error": err.Error()}
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, resp.Header, out
}

// checkConflicts submits, synchronously and not, each task that reuses id with other
// content, and wants each refused with 409 and nothing run.
func checkConflicts(t *testing.T, b *bundle, when, id string, others [][3]string) {
	t.Helper()
	active := b.activeTasks()
	for _, o := range others {
		for _, async := range []bool{false, true} {
			code, hdr, v := b.sendWithin(10*time.Second, "POST", "/run-task", taskBody(id, o[0], o[1], o[2], async))
			msg, _ := v["error"].(string)
			if code != 409 || !strings.Contains(msg, "task id "+id+" was used for a different task") || hdr.Get("Retry-After") != "" {
				t.Errorf("%s: %s resubmitted as type %s, label %s, parameters %s (async %v): %d %v; want 409",
					when, id, o[0], o[1], o[2], async, code, v)
			}
		}
	}
	if n := b.activeTasks(); n != active {
		t.Errorf("%s: conflicting resubmissions left %d tasks in flight, want %d", when, n, active)
	}
}

// A task id reused for another task (another label, type or parameters) is refused
// with 409 while the first is in flight and while its answer is retained, instead of
// being handed the first task's answer; the same task resubmitted gets that answer,
// and runs once.
func TestReusedTaskIDWithOtherContentIsConflict(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w := b.dial("w1", "label-a", "label-b")
	const params = `"{\"texts\":[\"first\"]}"`
	first := taskBody("task-1", "embed", "label-a", params, false)
	ans := b.postAsync(first)
	a := w.assignment()
	others := [][3]string{
		{"embed", "label-b", params},                       // another label
		{"classify", "label-a", params},                    // another type
		{"embed", "label-a", `"{\"texts\":[\"second\"]}"`}, // other parameters
		{"embed", "label-a", ""},                           // none
	}
	checkConflicts(t, b, "in flight", "task-1", others)
	w.finish(a, true, `{"answer":"first"}`)
	if got := <-ans; got.status != 200 {
		t.Fatalf("first run: %v", got)
	}
	checkConflicts(t, b, "answered", "task-1", others)

	// The same task again: the stored answer, whether the parameters come as a string
	// (as the seed sends them) or as the document itself, and asynchronously too.
	for _, body := range []string{first, taskBody("task-1", "embed", "label-a", `{"texts":["first"]}`, false)} {
		code, v := b.post("/run-task", body)
		if r, _ := v["result"].(map[string]any); code != 200 || r["answer"] != "first" {
			t.Fatalf("same task resubmitted (%s): %d %v", body, code, v)
		}
	}
	if code, v := b.post("/run-task", taskBody("task-1", "embed", "label-a", params, true)); code != 202 || v["status"] != "completed" {
		t.Fatalf("same task resubmitted asynchronously: %d %v", code, v)
	}
	if n := b.activeTasks(); n != 0 {
		t.Fatalf("%d tasks in flight after resubmissions of an answered task", n)
	}
}

// The journal keeps each task's fingerprint: after a restart, a reused id is refused
// (409) whether its task is pending or answered, and a record journaled by a build
// without fingerprints answers any content, as before.
func TestReusedTaskIDWithOtherContentIsConflictAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	first := setupJournaled(t, dir, clock)
	w := first.dial("w1", "m")
	if code, v := first.post("/run-task", taskBody("done-1", "t", "m", `{"n":1}`, true)); code != 202 {
		t.Fatalf("async submit: %d %v", code, v)
	}
	w.finish(w.assignment(), true, `"one"`)
	first.answered("done-1")
	w.ws.Close()
	first.awaitGone(first.registered("w1"))
	if code, v := first.post("/run-task", taskBody("pending-1", "t", "m", `{"n":2}`, true)); code != 202 {
		t.Fatalf("async submit: %d %v", code, v)
	}
	answerInJournal(t, first.d.hub.journal, clock.Now(), "old-1") // no fingerprint
	if err := first.d.Close(); err != nil {
		t.Fatal(err)
	}

	second := setupJournaled(t, dir, clock)
	for _, id := range []string{"done-1", "pending-1"} {
		checkConflicts(t, second, id+" after a restart", id, [][3]string{{"t", "m", `{"n":3}`}, {"t", "other", ""}})
	}
	if code, v := second.post("/run-task", taskBody("done-1", "t", "m", `{"n":1}`, false)); code != 200 || v["result"] != "one" {
		t.Fatalf("done-1 resubmitted after a restart: %d %v", code, v)
	}
	if code, v := second.post("/run-task", taskBody("pending-1", "t", "m", `{"n":2}`, true)); code != 202 || v["status"] != "queued" {
		t.Fatalf("pending-1 resubmitted after a restart: %d %v", code, v)
	}
	if code, v := second.post("/run-task", taskBody("old-1", "another", "label", `{"any":"thing"}`, false)); code != 200 || v["label"] != "m" {
		t.Fatalf("a record without a fingerprint resubmitted with other content: %d %v, want its answer", code, v)
	}
}

// A task refused as it is submitted because its label is failing is not kept as its
// id's answer: the producer's retry after Retry-After, same id and all, runs the task
// once the label works again, synchronous or asynchronous (with a journal, which keeps
// no record of the refusal either).
func TestRetryOfATaskRefusedAtAdmissionRuns(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	waiting := make(chan string, 8)
	b := setup(t, Config{DataDir: dir, Clock: clock, TaskRetention: time.Hour, onWait: func(id string) { waiting <- id },
		Scheduler: scheduler.Config{LabelFailureThreshold: 1, LabelFailureCooldown: time.Minute}})
	t.Cleanup(func() { b.d.Close() })
	w := b.dial("w1")
	// One failed load marks the label failing.
	ans := b.postAsync(`{"task_id":"first","task_type":"x","label":"flaky"}`)
	<-waiting
	w.loadFailed(w.assignment(), "transient CUDA error")
	if got := <-ans; got.status != 502 && got.status != 503 {
		t.Fatalf("first task: %v", got)
	}
	for _, body := range []string{taskBody("retry-sync", "x", "flaky", "", false), taskBody("retry-async", "x", "flaky", "", true)} {
		code, hdr, v := b.send("POST", "/run-task", body)
		if code != 503 || hdr.Get("Retry-After") == "" {
			t.Fatalf("%s for the failing label: %d %v %v", body, code, hdr, v)
		}
	}
	if keys := journalKeys(t, b.d.hub.journal, tasksBucket); strings.Contains(strings.Join(keys, ","), "retry-") {
		t.Fatalf("journal holds refused tasks: %q", keys)
	}
	if code, _ := b.get("/tasks/retry-sync"); code != 404 {
		t.Fatalf("GET of a refused task: %d, want 404 (not kept)", code)
	}

	clock.advance(2 * time.Minute) // past Retry-After and the cool-down
	ans = b.postAsync(taskBody("retry-sync", "x", "flaky", "", false))
	<-waiting
	a := w.assignment()
	w.finish(a, true, `"ran"`)
	if got := <-ans; got.status != 200 || a.TaskId != "retry-sync" || got.body["result"] != "ran" {
		t.Fatalf("synchronous retry after Retry-After: %v (assignment %v), want it run", got, a)
	}
	if code, v := b.post("/run-task", taskBody("retry-async", "x", "flaky", "", true)); code != 202 {
		t.Fatalf("asynchronous retry after Retry-After: %d %v", code, v)
	}
	if a := w.assignment(); a.TaskId != "retry-async" {
		t.Fatalf("asynchronous retry: assignment %v", a)
	}
}
