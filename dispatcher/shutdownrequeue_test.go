package dispatcher

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// A journaled task running when shutdown begins that comes back to the queue (its
// worker lost, or refusing it) is let go to the journal as a queued one is at the
// start of shutdown: it does not hold the shutdown until the shutdown timeout. With
// another worker connected, the scheduler placed it there in the same outcome, before
// the release looked, and the shutdown waited for that new attempt.
func TestJournaledTaskRequeuedDuringShutdownDoesNotHoldIt(t *testing.T) {
	lost := func(w *fakeWorker, _ *pb.TaskAssignment) { w.ws.Close() }
	refused := func(w *fakeWorker, a *pb.TaskAssignment) {
		w.write(&pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
			TaskId: a.TaskId, Attempt: a.Attempt, Error: "worker draining", Refused: true}}})
	}
	for _, tc := range []struct {
		name    string
		requeue func(w *fakeWorker, a *pb.TaskAssignment)
		other   bool // another worker that could take the task is connected
	}{
		{"worker lost", lost, false},
		{"attempt refused", refused, false},
		{"worker lost, another connected", lost, true},
		{"attempt refused, another connected", refused, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			clock := &testClock{now: time.Now()}
			b := setupJournaled(t, dir, clock)
			w := b.dial("w1", "m")
			if code, out := b.post("/run-task", `{"task_id":"x","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
				t.Fatalf("async submit: %d %v", code, out)
			}
			a := w.assignment()
			if tc.other {
				b.dial("w2", "m")
			}
			idle := b.d.hub.beginShutdown() // x runs: shutdown waits for it
			select {
			case <-idle:
				t.Fatal("shutdown did not wait for a running task")
			default:
			}
			tc.requeue(w, a)
			select {
			case <-idle:
			case <-time.After(10 * time.Second): // a failure bound, not synchronisation
				t.Fatal("shutdown still waits for a journaled task back in the queue")
			}
			if code, out := b.get("/tasks/x"); code != http.StatusOK || out["status"] != "queued" {
				t.Fatalf("during the shutdown: %d %v, want x queued, left to the journal", code, out)
			}
			if err := b.d.Close(); err != nil {
				t.Fatal(err)
			}
			after := setupJournaled(t, dir, clock)
			if code, out := after.get("/tasks/x"); code != http.StatusOK || out["status"] != "queued" {
				t.Fatalf("after a restart: %d %v, want x queued from the journal", code, out)
			}
		})
	}
}

// During shutdown, a journaled task whose worker is lost is placed on another worker
// in the same outcome and let go to the journal instead of sent there. That worker's
// view is left as the worker has it: it was never told to load the task's label nor
// to evict the one it holds. So the next task sent there, a synchronous one from the
// lost worker that shutdown still runs, loads its label and names that eviction,
// rather than join a load nobody asked for.
func TestShutdownWithdrawnAssignmentLeavesTheWorkersViewAlone(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	b := setupJournaled(t, dir, clock)
	w1 := b.dialHello(&pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: "w1", MaxLabels: 1, Slots: 2, HeldLabels: []string{"m"}})
	if code, out := b.post("/run-task", `{"task_id":"x","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
		t.Fatalf("async submit: %d %v", code, out)
	}
	w1.assignment()
	zAnswer := b.postAsync(`{"task_id":"z","task_type":"t","label":"m"}`)
	w1.assignment()
	w2 := b.dialHello(&pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: "w2", MaxLabels: 1, Slots: 1, HeldLabels: []string{"n"}})

	idle := b.d.hub.beginShutdown()
	wc := b.registered("w1")
	w1.ws.Close() // x goes to w2 and is withdrawn; z waits for w2's slot
	b.awaitGone(wc)
	// The call that took w1 out refilled the slot the withdrawal freed, not the next
	// tick (20 ms on): z is w2's already.
	for _, d := range b.d.hub.workerDetails() {
		if d.ID == "w2" && d.Running != 1 {
			t.Fatalf("w2 runs %d once w1 is gone, want z started in the same call that withdrew x", d.Running)
		}
	}
	a := w2.assignment()
	if a.TaskId != "z" || a.EvictLabel != "n" {
		t.Fatalf("w2 was sent %s evicting %q, want z evicting n: w2 still holds n and was never told to load m", a.TaskId, a.EvictLabel)
	}
	if code, v := b.get("/tasks/x"); code != http.StatusOK || v["status"] != "queued" || v["attempts"] != 1.0 {
		t.Fatalf("GET /tasks/x: %d %v, want it queued for the next start after its 1 start", code, v)
	}
	w2.finish(a, true, `"z done"`)
	if got := <-zAnswer; got.status != http.StatusOK || got.body["result"] != "z done" {
		t.Fatalf("z: %d %v", got.status, got.body)
	}
	select {
	case <-idle:
	case <-time.After(10 * time.Second): // a failure bound, not synchronisation
		t.Fatal("shutdown still waits")
	}
	for _, d := range b.d.hub.workerDetails() {
		if d.ID == "w2" && !slices.Equal(d.Labels, []string{"m"}) {
			t.Fatalf("w2's view holds %v, want [m]: the load z asked for", d.Labels)
		}
	}
}
