package dispatcher

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestOverdueWheelClosesOnceTheMomentPassed(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	w := newOverdueWheel(t0)
	at := t0.Add(2500 * time.Millisecond)
	ch := w.after(at)
	if ch != w.after(t0.Add(2900*time.Millisecond)) {
		t.Fatal("moments in the same second got different channels")
	}
	w.sweep(t0.Add(2 * time.Second))
	if closed(ch) {
		t.Fatal("closed before its moment")
	}
	w.sweep(t0.Add(3 * time.Second))
	if !closed(ch) {
		t.Fatal("still open a second after its moment")
	}
	if !closed(w.after(at)) {
		t.Fatal("a moment already swept past must be closed at once")
	}
}

func TestOverdueWheelSurvivesAClockJump(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	w := newOverdueWheel(t0)
	near, far := w.after(t0.Add(time.Second)), w.after(t0.Add(48*time.Hour))
	w.sweep(t0.Add(24 * time.Hour))
	if !closed(near) || closed(far) {
		t.Fatalf("after a day: near closed=%v (want true), far closed=%v (want false)", closed(near), closed(far))
	}
	if len(w.buckets) != 1 {
		t.Fatalf("%d buckets left, want 1", len(w.buckets))
	}
}

// A worker that overruns its task's deadline and never reports back does not leave the
// producer waiting forever: once overdueGrace has passed, it gets 504, and the task
// stays visible as running.
func TestOverdueTaskAnswers504(t *testing.T) {
	t.Parallel()
	// Just past a whole second, so that the moment's second is rounded up by almost a
	// whole second: the worst case for "answered within a second of its moment".
	clock := &testClock{now: time.Now().Truncate(time.Second).Add(5 * time.Millisecond)}
	waiting := make(chan string, 1)
	b := setup(t, Config{Clock: clock, onWait: func(id string) { waiting <- id }})
	w := b.dial("w1", "m")
	ans := b.postAsync(`{"task_id":"slow","task_type":"x","label":"m","timeout_ms":1000}`)
	w.assignment() // and never answer
	<-waiting
	overdueAt := b.d.hub.known("slow").sched.Deadline.Add(overdueGrace)
	clock.advance(time.Second + overdueGrace - 10*time.Millisecond)
	b.d.hub.tick()
	if closed(b.d.hub.overdue.after(overdueAt)) {
		t.Fatal("producer released before the grace was over")
	}
	// A second past the moment: the wheel answers within a second of it, as its
	// second is rounded up. One second from the step above (0.99 s past the moment)
	// left the producer waiting whenever the moment fell in a second's first 10 ms.
	clock.advance(time.Second + 10*time.Millisecond)
	got := <-ans // the background tick closes the wheel's second
	if got.status != 504 || !strings.Contains(fmt.Sprint(got.body["error"]), "still running") {
		t.Fatalf("answer %v, want 504 saying the task is still running", got)
	}
	if code, v := b.get("/tasks/slow"); code != 200 || v["status"] != "running" {
		t.Fatalf("GET /tasks/slow: %d %v, want the task still running", code, v)
	}
}
