package dispatcher

import (
	"net/http"
	"testing"
	"time"

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
