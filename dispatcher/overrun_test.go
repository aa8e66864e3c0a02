package dispatcher

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// overrun runs task id (timeout 1 s) on worker w, which never answers, and moves the
// clock past its deadline and overrunGrace; the hub's tick then answers the task. It
// returns the attempt.
func overrun(t *testing.T, b *bundle, clock *testClock, w *fakeWorker, id string) *pb.TaskAssignment {
	t.Helper()
	a := w.assignment()
	if a.TaskId != id {
		t.Fatalf("assignment of %s, want %s", a.TaskId, id)
	}
	clock.advance(time.Second + overrunGrace - 10*time.Millisecond)
	b.d.hub.tick()
	if code, v := b.get("/tasks/" + id); code != 200 || v["status"] != "running" {
		t.Fatalf("GET /tasks/%s before the grace was over: %d %v, want it running", id, code, v)
	}
	clock.advance(10 * time.Millisecond)
	b.d.hub.tick()
	b.answered(id)
	c := w.read().GetCancel()
	if c == nil || c.GetTaskId() != id || c.GetAttempt() != a.Attempt {
		t.Fatalf("want a Cancel of %s attempt %d, got %v", id, a.Attempt, c)
	}
	return a
}

// A worker that overruns its task's deadline and never answers does not leave the task
// running for ever: overrunGrace after the deadline the task fails with 504 naming the
// worker, its producer gets that answer, and the worker is told to cancel. The
// worker's slot stays busy until its late result, which frees it and changes nothing
// of the answer.
func TestOverrunTaskFailsAndKeepsTheSlotUntilTheLateResult(t *testing.T) {
	t.Parallel()
	clock := &testClock{now: time.Now()}
	waiting := make(chan string, 1)
	b := setup(t, Config{Clock: clock, onWait: func(id string) { waiting <- id }})
	w := b.dial("w1", "m") // one slot
	ans := b.postAsync(`{"task_id":"slow","task_type":"x","label":"m","timeout_ms":1000}`)
	<-waiting
	if code, _ := b.post("/run-task", `{"task_id":"next","task_type":"x","label":"m","return_result":false}`); code != 202 {
		t.Fatalf("second task: %d", code)
	}
	a := overrun(t, b, clock, w, "slow")

	got := <-ans
	msg := fmt.Sprint(got.body["error"])
	if got.status != 504 || got.body["status"] != "failed" || got.body["worker_id"] != "w1" ||
		!strings.Contains(msg, `worker "w1" overran`) || !strings.Contains(msg, "did not answer") {
		t.Fatalf("answer %v, want 504 failed saying w1 overran the deadline and did not answer", got)
	}
	if code, v := b.get("/tasks/slow"); code != 200 || v["status"] != "failed" || v["error"] != msg {
		t.Fatalf("GET /tasks/slow: %d %v, want the same failure", code, v)
	}
	if n := testutil.ToFloat64(b.d.hub.met.failed.WithLabelValues("m", "worker_overran")); n != 1 {
		t.Fatalf("failed{reason=worker_overran} = %v, want 1", n)
	}
	// The worker has not said it stopped: its slot is still taken.
	if _, v := b.get("/tasks/next"); v["status"] != "queued" {
		t.Fatalf("next task %v, want it queued behind the overrun slot", v)
	}
	if d := b.d.hub.workerDetails(); len(d) != 1 || d[0].Running != 1 {
		t.Fatalf("worker detail %+v, want w1 running 1", d)
	}

	w.finish(a, true, `"late"`) // the backend call returned at last
	if n := w.assignment(); n.TaskId != "next" {
		t.Fatalf("the freed slot took %s, want next", n.TaskId)
	}
	if code, v := b.get("/tasks/slow"); code != 200 || v["status"] != "failed" || v["result"] != nil {
		t.Fatalf("GET /tasks/slow after the late result: %d %v, want the 504 unchanged", code, v)
	}
	if code, v := b.post("/run-task", `{"task_id":"slow","task_type":"x","label":"m"}`); code != 504 || v["error"] != msg {
		t.Fatalf("resubmission of slow: %d %v, want its 504", code, v)
	}
}

// The worker of an overrun attempt leaving does not bring the answered task back:
// another worker gets the next task, not it.
func TestOverrunTaskIsNotRequeuedWhenItsWorkerLeaves(t *testing.T) {
	t.Parallel()
	clock := &testClock{now: time.Now()}
	b := setup(t, Config{Clock: clock})
	w1 := b.dial("w1", "m")
	if code, _ := b.post("/run-task", `{"task_id":"slow","task_type":"x","label":"m","timeout_ms":1000,"return_result":false}`); code != 202 {
		t.Fatalf("submit: %d", code)
	}
	overrun(t, b, clock, w1, "slow")
	w2 := b.dial("w2", "m")
	wc := b.registered("w1")
	w1.ws.Close()
	b.awaitGone(wc)
	if code, _ := b.post("/run-task", `{"task_id":"probe","task_type":"x","label":"m","return_result":false}`); code != 202 {
		t.Fatalf("probe: %d", code)
	}
	if a := w2.assignment(); a.TaskId != "probe" {
		t.Fatalf("w2 was given %s, want probe: the overrun task came back", a.TaskId)
	}
	if _, v := b.get("/tasks/slow"); v["status"] != "failed" {
		t.Fatalf("slow after its worker left: %v", v)
	}
}

// A journaled task's overrun answer is journaled: the next start serves it and does
// not run the task again.
func TestOverrunAnswerIsJournaled(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	first := setupJournaled(t, dir, clock)
	w := first.dial("w1", "m")
	if code, _ := first.post("/run-task", `{"task_id":"j-slow","task_type":"x","label":"m","timeout_ms":1000,"return_result":false}`); code != 202 {
		t.Fatalf("submit: %d", code)
	}
	overrun(t, first, clock, w, "j-slow")
	if err := first.d.Close(); err != nil { // crash
		t.Fatal(err)
	}

	second := setupJournaled(t, dir, clock)
	if code, v := second.get("/tasks/j-slow"); code != 200 || v["status"] != "failed" || !strings.Contains(fmt.Sprint(v["error"]), "overran") {
		t.Fatalf("after restart: %d %v, want the overrun failure", code, v)
	}
	w2 := second.dial("w2", "m")
	second.post("/run-task", `{"task_id":"probe","task_type":"x","label":"m","return_result":false}`)
	if a := w2.assignment(); a.TaskId != "probe" {
		t.Fatalf("w2 was given %s, want probe: the answered task ran again", a.TaskId)
	}
}

// A task id run again while an overrun attempt of it still holds its worker's slot
// (its 504 has left the retention): the new run's attempt is numbered after the
// overrun one, so the agent does not ignore it as a duplicate of the attempt it still
// runs, and that attempt's late result frees its slot instead of answering the new
// run. The new run counts its own starts in its view and in the journal, whose answer
// for the id is the new run's after a restart.
func TestResubmissionIsNotAnsweredByAnOverrunAttemptsLateResult(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	b := setup(t, Config{DataDir: dir, Clock: clock, TaskRetention: time.Minute})
	t.Cleanup(func() { b.d.Close() })
	w := b.dialHello(&pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: "w1", MaxLabels: 2, Slots: 2, HeldLabels: []string{"m"}})
	if code, _ := b.post("/run-task", `{"task_id":"x","task_type":"t","label":"m","timeout_ms":1000,"return_result":false}`); code != 202 {
		t.Fatalf("submit: %d", code)
	}
	old := overrun(t, b, clock, w, "x") // 504 and a Cancel; the backend call goes on
	clock.advance(2 * time.Minute)      // the 504 leaves the retention
	b.d.hub.tick()
	if code, _ := b.get("/tasks/x"); code != 404 {
		t.Fatalf("GET /tasks/x after the retention: %d, want 404", code)
	}

	if code, v := b.post("/run-task", `{"task_id":"x","task_type":"t","label":"m","return_result":false}`); code != 202 {
		t.Fatalf("resubmission: %d %v", code, v)
	}
	again := w.assignment() // w1's other slot
	if again.TaskId != "x" || again.Attempt != old.Attempt+1 {
		t.Fatalf("new run of x sent as attempt %d, want %d: attempt %d of x still runs on w1 after it overran",
			again.Attempt, old.Attempt+1, old.Attempt)
	}
	if _, v := b.get("/tasks/x"); v["status"] != "running" || v["attempts"] != 1.0 {
		t.Fatalf("GET /tasks/x: %v, want running, 1 attempt (the new run's own starts)", v)
	}
	// Results are read in order: the late one is dealt with before the new run's.
	w.finish(old, true, `"late result of the first run"`)
	w.finish(again, true, `"second run"`)
	b.answered("x")
	if _, v := b.get("/tasks/x"); v["status"] != "completed" || v["result"] != "second run" || v["attempts"] != 1.0 {
		t.Fatalf("GET /tasks/x: %v, want completed with the second run's result", v)
	}
	if d := b.d.hub.workerDetails(); len(d) != 1 || d[0].Running != 0 {
		t.Fatalf("worker detail %+v, want w1 running nothing: both attempts answered", d)
	}
	if err := b.d.Close(); err != nil {
		t.Fatal(err)
	}

	after := setupJournaled(t, dir, clock)
	if code, v := after.get("/tasks/x"); code != 200 || v["status"] != "completed" || v["result"] != "second run" || v["attempts"] != 1.0 {
		t.Fatalf("GET /tasks/x after a restart: %d %v, want the second run's answer", code, v)
	}
}

// The late result of an overrun attempt is a run like any other: the worker's slot was
// busy with the label for that long. The hub hands its run time to the scheduler, so
// that a holder whose runs can take a minute no longer looks about to free up: the
// next task for the label loads on an idle worker rather than wait behind one.
func TestLateResultOfAnOverrunAttemptTeachesItsRunTime(t *testing.T) {
	t.Parallel()
	clock := &testClock{now: time.Now()}
	waiting := make(chan string, 1)
	b := setup(t, Config{Clock: clock, onWait: func(id string) { waiting <- id }})
	w1 := b.dial("w1", "m") // one slot
	ans := b.postAsync(`{"task_id":"slow","task_type":"x","label":"m","timeout_ms":1000}`)
	<-waiting
	b.submitAsync("long", "m") // queued behind slow
	a := overrun(t, b, clock, w1, "slow")
	if got := <-ans; got.status != 504 {
		t.Fatalf("slow answered %d, want 504", got.status)
	}
	w1.write(&pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
		TaskId: a.TaskId, Attempt: a.Attempt, Ok: true, Result: []byte(`"late"`), RunDurationUs: time.Minute.Microseconds()}}})
	if n := w1.assignment(); n.TaskId != "long" {
		t.Fatalf("the freed slot took %s, want long", n.TaskId)
	}

	w2 := b.dial("w2") // idle, with room for m
	b.submitAsync("probe", "m")
	if st := b.status("probe"); st != "running" {
		t.Fatalf("probe %s, want it loading m on the idle w2 rather than waiting behind a run like the minute-long one", st)
	}
	if n := w2.assignment(); n.TaskId != "probe" || n.Label != "m" {
		t.Fatalf("w2 was given %v, want probe", n)
	}
}
