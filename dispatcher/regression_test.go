package dispatcher

import (
	"testing"
	"time"

	"github.com/gorilla/websocket"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// Tests from a review of the hub: each reproduced a bug before its fix.

// A task answered by a shutdown that ran out of time is let go by the scheduler: when
// its worker is lost afterwards it is not sent to another worker, and it stays failed.
func TestAnsweredTaskIsNotReassigned(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w1 := b.dial("w1", "m")
	w2 := b.dial("w2", "other")
	ans := b.postAsync(`{"task_id":"t1","task_type":"x","label":"m"}`)
	w1.assignment()
	w1Conn := b.registered("w1")
	b.d.hub.beginShutdown()
	b.d.hub.failAll("shutdown")
	if got := <-ans; got.status != 503 {
		t.Fatalf("answer %v", got)
	}
	w1.ws.Close() // the worker is lost after its task was answered
	b.awaitGone(w1Conn)
	if code, v := b.get("/tasks/t1"); code != 200 || v["status"] != "failed" {
		t.Fatalf("answered task now reports %d %v", code, v)
	}
	// The answered task was not handed to w2.
	b.d.hub.mu.Lock()
	v, _ := b.d.hub.sched.Worker("w2")
	b.d.hub.mu.Unlock()
	if v.Running != 0 {
		t.Fatalf("w2 runs %d tasks, want none", v.Running)
	}
	_ = w2
}

// A resubmitted id whose stored answer is older than its deadline gets that answer,
// every time (the safety timer used to race the closed done channel).
func TestResubmissionAfterDeadlineGetsStoredAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w := b.dial("w1", "m")
	ans := b.postAsync(`{"task_id":"r1","task_type":"x","label":"m"}`)
	w.finish(w.assignment(), true, `"ok"`)
	if got := <-ans; got.status != 200 {
		t.Fatalf("first answer %v", got)
	}
	rec := b.d.hub.known("r1")
	rec.sched.Deadline = time.Now().Add(-time.Hour) // as if answered long ago
	for i := 0; i < 20; i++ {
		if code, v := b.post("/run-task", `{"task_id":"r1","task_type":"x","label":"m"}`); code != 200 || v["result"] != "ok" {
			t.Fatalf("resubmission %d: %d %v", i, code, v)
		}
	}
}

// A task requeued because its worker was lost reads as queued, not as running on the
// lost worker.
func TestRequeuedTaskReadsQueued(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w1 := b.dial("w1", "m")
	b.postAsync(`{"task_id":"q1","task_type":"x","label":"m","timeout_ms":60000}`)
	w1.assignment()
	w1Conn := b.registered("w1")
	w1.ws.Close()
	b.awaitGone(w1Conn)
	if _, v := b.get("/tasks/q1"); v["status"] != "queued" || v["worker_id"] != nil {
		t.Fatalf("requeued task reads %v on %v", v["status"], v["worker_id"])
	}
}

// A worker that stopped an attempt at its deadline gets the producer a 504, even when
// the result arrives before the dispatcher's own clock reaches the deadline (the
// deadline travels in whole milliseconds, and two hosts' clocks differ).
func TestWorkerDeadlineGives504(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w := b.dial("w1", "m")
	ans := b.postAsync(`{"task_id":"d1","task_type":"x","label":"m","timeout_ms":60000}`)
	a := w.assignment()
	w.write(&pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
		TaskId: a.TaskId, Attempt: a.Attempt, Error: "deadline exceeded", DeadlineExceeded: true}}})
	if got := <-ans; got.status != 504 {
		t.Fatalf("answer %v, want 504", got)
	}
}

func TestCeilMilli(t *testing.T) {
	t.Parallel()
	base := time.UnixMilli(1_700_000_000_000)
	for _, c := range []struct {
		in   time.Time
		want int64
	}{{base, base.UnixMilli()}, {base.Add(time.Nanosecond), base.UnixMilli() + 1}, {base.Add(999 * time.Microsecond), base.UnixMilli() + 1}} {
		if got := ceilMilli(c.in); got != c.want {
			t.Errorf("ceilMilli(%v) = %d, want %d", c.in, got, c.want)
		}
	}
}

// One pinger serves every worker: a worker that answers pings stays connected, and
// one that stops reading (no pongs) is dropped once its read deadline passes.
func TestPingsFromTheSharedPinger(t *testing.T) {
	t.Parallel()
	// Short enough for a quick test, long enough that a loaded machine's scheduling
	// stalls do not miss a pong (the drop comes after 2.5 intervals of silence).
	b := setup(t, Config{PingInterval: 250 * time.Millisecond})
	alive := b.dial("alive", "m")
	pings := make(chan struct{}, 16)
	alive.ws.SetPingHandler(func(data string) error {
		select {
		case pings <- struct{}{}:
		default:
		}
		return alive.ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
	})
	go func() { // gorilla answers pings only while the worker reads
		for {
			if _, _, err := alive.ws.ReadMessage(); err != nil {
				return
			}
		}
	}()
	b.dial("silent", "m") // never reads again: no pongs
	silent := b.registered("silent")
	for i := 0; i < 3; i++ {
		select {
		case <-pings:
		case <-time.After(10 * time.Second): // a failure bound, not synchronisation
			t.Fatalf("only %d pings reached the answering worker; workers now %v", i, b.workers())
		}
	}
	b.awaitGone(silent)
	if !contains(b.workers(), "alive") {
		t.Fatal("the worker answering pings was dropped")
	}
}

// A connection closed while its flusher holds a batch still sends its close frame: the
// worker must learn the code (REPLACED makes an agent give up; anything else makes it
// reconnect).
func TestCloseFrameLeavesWhileABatchIsHeld(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w := b.dial("held", "m")
	b.d.hub.mu.Lock()
	wc := b.d.hub.workers["held"]
	b.d.hub.mu.Unlock()
	wc.batch.Hold() // as the flusher does in the middle of a batch
	wc.close(&Disconnect{Code: pb.CloseCode_CLOSE_CODE_REPLACED, Reason: "test"})
	if code, _ := w.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_REPLACED) {
		t.Fatalf("close code %d, want REPLACED", code)
	}
}
