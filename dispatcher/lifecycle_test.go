package dispatcher

import (
	"testing"
	"time"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// Tests from a review of the task lifecycle: each reproduced a bug before its fix.

// runningPastDeadline has task "late" (1 s timeout) running on w1, w2 idle with its
// label, and the clock 2 s on: the task's deadline has passed while it ran.
func runningPastDeadline(t *testing.T) (b *bundle, w1, w2 *fakeWorker, a *pb.TaskAssignment) {
	t.Helper()
	clock := &testClock{now: time.Now()}
	b = setup(t, Config{Clock: clock})
	w1 = b.dial("w1", "m")
	b.postAsync(`{"task_id":"late","task_type":"x","label":"m","timeout_ms":1000,"return_result":false}`)
	if a = w1.assignment(); a.TaskId != "late" {
		t.Fatalf("assignment %v", a)
	}
	w2 = b.dial("w2", "m") // idle, holds the label
	clock.advance(2 * time.Second)
	return b, w1, w2, a
}

// A task whose deadline passed while it ran, and whose worker is then lost, fails with
// 504 instead of being sent to another worker: a task past its deadline never starts.
func TestLostWorkersTaskPastDeadlineIsNotReassigned(t *testing.T) {
	t.Parallel()
	b, w1, w2, _ := runningPastDeadline(t)
	w1.ws.Close() // lost while running, past the deadline
	waitStatus(t, b, "late", "failed")
	if code, v := b.get("/tasks/late"); code != 200 || v["attempts"] != float64(1) {
		t.Fatalf("task reads %d %v", code, v)
	}
	// w2's next frame is a fresh task's assignment, not the expired one.
	b.postAsync(`{"task_id":"next","task_type":"x","label":"m","return_result":false}`)
	if a := w2.assignment(); a.TaskId != "next" {
		t.Fatalf("w2 was sent %v, want the fresh task", a)
	}
}

// The same for an attempt its worker refused after the task's deadline passed.
func TestRefusedTaskPastDeadlineIsNotReassigned(t *testing.T) {
	t.Parallel()
	b, w1, w2, a := runningPastDeadline(t)
	w1.write(&pb.Envelope{Body: &pb.Envelope_Status{Status: &pb.WorkerStatus{Accepting: false, Reason: "draining"}}})
	w1.write(&pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
		TaskId: a.TaskId, Attempt: a.Attempt, Error: "worker draining", Refused: true}}})
	waitStatus(t, b, "late", "failed")
	b.postAsync(`{"task_id":"next","task_type":"x","label":"m","return_result":false}`)
	if a := w2.assignment(); a.TaskId != "next" {
		t.Fatalf("w2 was sent %v, want the fresh task", a)
	}
}
