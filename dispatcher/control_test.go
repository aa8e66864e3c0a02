package dispatcher

import (
	"fmt"
	"net/url"
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

// A drain reason that is not UTF-8 cannot go into a Drain frame as it is. The worker
// must still be told (the reason cleaned), or it would sit connected and out of the
// routing for good.
func TestDrainReasonNotUTF8StillReachesTheWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w := b.dial("w1", "m")
	if code, out := b.post("/workers/w1/drain?reason=disk%ff", ""); code != 202 {
		t.Fatalf("drain: %d %v", code, out)
	}
	if d := w.read().GetDrain(); d == nil || d.GetReason() != "disk\uFFFD" {
		t.Fatalf("want a Drain with the reason cleaned, got %v", d)
	}
}

// A drain whose query string does not parse is refused and drains nothing: the
// reason would otherwise be dropped without a word.
func TestDrainWithABadQueryStringDrainsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w1 := b.dial("w1", "m")
	for _, q := range []string{"reason=disk%zz", "reason=disk;x=1", "reason=a&reason=b", "colour=red"} {
		if code, out := b.post("/workers/w1/drain?"+q, ""); code != 400 || !strings.Contains(fmt.Sprint(out["error"]), "reason") && !strings.Contains(fmt.Sprint(out["error"]), "query string") {
			t.Errorf("drain?%s: %d %v, want 400 naming the problem", q, code, out)
		}
	}
	ans := b.postAsync(`{"task_id":"nd-1","task_type":"x","label":"m"}`)
	a := w1.assignment() // still routed to: not drained
	w1.finish(a, true, `"ok"`)
	if got := <-ans; got.status != 200 || got.body["worker_id"] != "w1" {
		t.Fatalf("task after refused drains: %v", got)
	}
}

// Ids are escaped in paths as clients escape them (encodeURIComponent, Python's
// quote(safe=""), url.PathEscape): GET /tasks/{id} and POST /workers/{id}/drain take
// them unescaped, as /run-task and the hello took them.
func TestEscapedIDsInPaths(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for _, c := range []struct{ id, path string }{
		{"job/1", "job%2F1"}, {"job:2", "job%3A2"}, {"a=b", "a%3Db"}, {"x+y", "x%2By"},
	} {
		if code, out := b.post("/run-task", fmt.Sprintf(`{"task_id":%q,"task_type":"t","label":"m","return_result":false}`, c.id)); code != 202 {
			t.Fatalf("submit %q: %d %v", c.id, code, out)
		}
		if code, out := b.get("/tasks/" + c.path); code != 200 || out["task_id"] != c.id {
			t.Errorf("GET /tasks/%s for the accepted id %q: %d %v", c.path, c.id, code, out)
		}
	}
	b = setup(t, Config{}) // a fleet with no tasks: the first frame a worker reads is the Drain
	for _, id := range []string{"pod/1", "pod%1", "pod?1", "pod#1"} {
		w := b.dial(id, "m")
		if code, out := b.post("/workers/"+url.PathEscape(id)+"/drain", ""); code != 202 || out["worker_id"] != id {
			t.Errorf("drain of the connected worker %q: %d %v", id, code, out)
		}
		if w.read().GetDrain() == nil {
			t.Errorf("worker %q got no Drain", id)
		}
	}
}

// A status saying the worker accepts, sent before the Drain reached it (its backend
// came back, say), does not put a drained worker back in the routing.
func TestStatusAfterDrainKeepsTheWorkerOut(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w1 := b.dial("w1", "m")
	if code, out := b.post("/workers/w1/drain", ""); code != 202 {
		t.Fatalf("drain: %d %v", code, out)
	}
	w1.write(&pb.Envelope{Body: &pb.Envelope_Status{Status: &pb.WorkerStatus{Accepting: true, Reason: "backend ready"}}})
	// w1's frames are handled in order: once /labels shows this later one, the status
	// has been too. (Polled: a drained w1 takes no task whose answer could say so.)
	w1.write(&pb.Envelope{Body: &pb.Envelope_LabelEvent{LabelEvent: &pb.LabelEvent{Kind: pb.LabelEvent_KIND_LOADED, Label: "z"}}})
	waitFor(t, "w1's LOADED z, sent after its status, in /labels", func() bool {
		_, labels := b.get("/labels")
		return fmt.Sprint(labels["z"]) == "[w1]"
	})
	if d := w1.read().GetDrain(); d == nil {
		t.Fatalf("want the Drain, got %v", d)
	}
	w2 := b.dial("w2")
	ans := b.postAsync(`{"task_id":"after-drain","task_type":"x","label":"m"}`)
	a := w2.assignment()
	w2.finish(a, true, `"ok"`)
	if got := <-ans; got.status != 200 || got.body["worker_id"] != "w2" {
		t.Fatalf("task after the drain: %v", got)
	}
}

// An asynchronous task that ran and failed before its producer was answered still gets
// its 202: only a refusal as it is routed answers the POST itself. The run's failure is
// for GET /tasks/{id}, as for any asynchronous task.
func TestAsyncTaskFailingBeforeItsAnswerStillGets202(t *testing.T) {
	t.Parallel()
	var b *bundle
	var w *fakeWorker
	b = setup(t, Config{onAsyncAdmitted: func(id string) {
		w.finish(w.assignment(), false, "") // the worker fails it at once
		<-b.d.hub.known(id).done
	}})
	w = b.dial("w1", "m")
	code, out := b.post("/run-task", `{"task_id":"af-1","task_type":"x","label":"m","return_result":false}`)
	if code != 202 {
		t.Fatalf("async task that failed on its worker before the POST was answered: %d %v, want 202", code, out)
	}
	if code, v := b.get("/tasks/af-1"); code != 200 || v["status"] != "failed" {
		t.Fatalf("GET /tasks/af-1: %d %v, want it failed", code, v)
	}
}
