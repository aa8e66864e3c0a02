package dispatcher

import (
	"strings"
	"testing"
	"time"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// POST /workers/{id}/drain sends the worker a Drain with the reason and takes it out
// of the routing at once; an unknown worker is a 404.
func TestDrainWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w1 := b.dial("w1", "m")
	code, out := b.post("/workers/w1/drain?reason=node+maintenance", "")
	if code != 202 || out["worker_id"] != "w1" || out["draining"] != true {
		t.Fatalf("drain: %d %v", code, out)
	}
	if d := w1.read().GetDrain(); d == nil || d.GetReason() != "node maintenance" {
		t.Fatalf("want a Drain with the reason, got %v", d)
	}
	// Nothing new goes to the draining worker, though it holds the label.
	ans := b.postAsync(`{"task_id":"dr-1","task_type":"x","label":"m"}`)
	w2 := b.dial("w2")
	a := w2.assignment()
	w2.finish(a, true, `"ok"`)
	if got := <-ans; got.status != 200 || got.body["worker_id"] != "w2" {
		t.Fatalf("task during the drain: %v", got)
	}
	if code, out := b.post("/workers/nobody/drain", ""); code != 404 || !strings.Contains(out["error"].(string), `"nobody" is not connected`) {
		t.Fatalf("drain of an unknown worker: %d %v", code, out)
	}
}

// A shutdown that runs out of time cancels the attempts it answered on their workers,
// before the close frame: otherwise they would run to the end for nobody.
func TestShutdownTimeoutCancelsRunningAttempts(t *testing.T) {
	t.Parallel()
	b, cancel, runErr := run(t, Config{ShutdownTimeout: 100 * time.Millisecond})
	w := b.dial("w1", "m")
	ans := b.postAsync(`{"task_id":"sc-1","task_type":"x","label":"m"}`)
	a := w.assignment()
	cancel() // SIGTERM; the worker never finishes the task
	if got := <-ans; got.status != 503 {
		t.Fatalf("task answered by the shutdown: %v", got)
	}
	c := w.read().GetCancel()
	if c == nil || c.GetTaskId() != "sc-1" || c.GetAttempt() != a.Attempt || !strings.Contains(c.GetReason(), "shut down") {
		t.Fatalf("want a Cancel of sc-1 attempt %d, got %v", a.Attempt, c)
	}
	if code, _ := w.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_SHUTDOWN) {
		t.Fatalf("worker close code %d", code)
	}
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
}
