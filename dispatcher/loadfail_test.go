package dispatcher

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// loadFailed reports, as an agent does, that the load the assignment started failed.
func (w *fakeWorker) loadFailed(a *pb.TaskAssignment, reason string) {
	w.write(&pb.Envelope{Body: &pb.Envelope_LabelEvent{LabelEvent: &pb.LabelEvent{
		Kind: pb.LabelEvent_KIND_LOAD_FAILED, Label: a.Label, Error: reason}}})
	w.write(&pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
		TaskId: a.TaskId, Attempt: a.Attempt, Error: "load label: " + reason, LoadFailed: true, LabelMiss: true,
		LoadDurationUs: 1500}}})
}

// A failed load is still a load: it counts in label_loads_total and the load time
// histogram (README: failed ones included), and the task's answer says it missed and
// how long it spent loading, as the agent reported.
func TestFailedLoadCountsAsALabelLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Scheduler: scheduler.Config{FleetSettle: time.Millisecond}})
	w := b.dial("w1")
	ans := b.postAsync(`{"task_id":"fl-1","task_type":"x","label":"L"}`)
	w.loadFailed(w.assignment(), "CUDA out of memory")
	got := await(t, ans)
	if got.status != http.StatusBadGateway {
		t.Fatalf("task whose only load failed: %v, want 502", got)
	}
	if got.body["label_miss"] != true || got.body["load_ms"] != 1.5 {
		t.Errorf("answer label_miss %v, load_ms %v; want true and 1.5", got.body["label_miss"], got.body["load_ms"])
	}
	if n := testutil.ToFloat64(b.d.hub.met.loads.WithLabelValues("L")); n != 1 {
		t.Errorf("label_loads_total{label=\"L\"} = %v after one failed load, want 1", n)
	}
	if n, sum := histogram(t, b.d.hub.met.loadDuration); n != 1 || sum != 0.0015 {
		t.Errorf("load_duration_seconds: %d samples, sum %v; want 1 of 0.0015", n, sum)
	}
}

// A task that waited for a load another task started gets its failure too, without
// label_miss: it runs elsewhere, but the one failed load is not counted again.
func TestJoinedLoadFailureDoesNotCount(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Scheduler: scheduler.Config{LabelFailureThreshold: 1, LabelFailureCooldown: time.Hour}})
	w1 := b.dial("w1", "L")
	ans := b.postAsync(`{"task_id":"jf-1","task_type":"x","label":"L"}`)
	a := w1.assignment()
	w2 := b.dial("w2")
	w1.write(&pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
		TaskId: a.TaskId, Attempt: a.Attempt, Error: "load label: CUDA out of memory", LoadFailed: true}}})
	a2 := w2.assignment()
	if a2.TaskId != "jf-1" || a2.Attempt != 2 {
		t.Fatalf("after a joined load failure on w1: %v", a2)
	}
	// The load w2 starts fails: with a threshold of one, that marks the label failing.
	w2.loadFailed(a2, "CUDA out of memory")
	if got := <-ans; got.status != 503 || !strings.Contains(got.body["error"].(string), "failing") {
		t.Fatalf("after the failed load w2 started: %v", got)
	}
}

// A label that fails to load on one worker runs on another; one that keeps failing is
// marked failing, and its tasks fail fast with 503 and the load error until the
// cool-down ends.
func TestLoadFailureRunsElsewhereThenLabelFailsFast(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Scheduler: scheduler.Config{LabelFailureThreshold: 2, LabelFailureCooldown: time.Hour}})
	w1 := b.dial("w1", "bad", "bad2") // holds both: tasks for them go to it first
	ans := b.postAsync(`{"task_id":"lf-1","task_type":"x","label":"bad"}`)
	a := w1.assignment()
	w2 := b.dial("w2")
	w1.loadFailed(a, "CUDA out of memory")
	a2 := w2.assignment()
	if a2.TaskId != "lf-1" || a2.Attempt != 2 {
		t.Fatalf("after a load failure on w1: %v", a2)
	}
	w2.finish(a2, true, `"ok"`)
	if got := <-ans; got.status != 200 || got.body["worker_id"] != "w2" || got.header.Get("Retry-After") != "" {
		t.Fatalf("answer %v", got)
	}

	// Two failures of another label within the window: the label is failing.
	ans = b.postAsync(`{"task_id":"lf-2","task_type":"x","label":"bad2"}`)
	a = w1.assignment()
	w1.loadFailed(a, "weights corrupt")
	a2 = w2.assignment()
	w2.loadFailed(a2, "weights corrupt")
	got := <-ans
	if got.status != 503 || !strings.Contains(got.body["error"].(string), "weights corrupt") || !strings.Contains(got.body["error"].(string), "failing") {
		t.Fatalf("task whose label tripped: %v", got)
	}
	// Retry-After is the rest of the cool-down (an hour), so a producer waits it out
	// instead of spending its retries at once; a resubmitted id's refusal too (a
	// refusal is not kept: the id is refused afresh while the label is failing).
	checkCoolDownLeft(t, "the task whose label tripped", got.header)
	got = <-b.postAsync(`{"task_id":"lf-3","task_type":"x","label":"bad2"}`)
	if got.status != 503 || !strings.Contains(got.body["error"].(string), "weights corrupt") {
		t.Fatalf("task for a failing label: %v", got)
	}
	checkCoolDownLeft(t, "a task for the failing label", got.header)
	checkCoolDownLeft(t, "lf-3 submitted again", (<-b.postAsync(`{"task_id":"lf-3","task_type":"x","label":"bad2"}`)).header)
	// An asynchronous task for it is refused the same way, not told 202 for a task
	// that has already failed.
	code, hdr, out := b.send("POST", "/run-task", `{"task_id":"lf-3a","task_type":"x","label":"bad2","return_result":false}`)
	if msg, _ := out["error"].(string); code != 503 || !strings.Contains(msg, "weights corrupt") {
		t.Fatalf("async task for a failing label: %d %v", code, out)
	}
	checkCoolDownLeft(t, "an async task for the failing label", hdr)
	// Other labels still run.
	w3 := b.dial("w3", "fine")
	ans = b.postAsync(`{"task_id":"lf-4","task_type":"x","label":"fine"}`)
	a = w3.assignment()
	w3.finish(a, true, `"ok"`)
	if got := <-ans; got.status != 200 {
		t.Fatalf("a healthy label: %v", got)
	}
}

// checkCoolDownLeft checks that an answer's Retry-After is the rest of an hour's
// cool-down, in whole seconds rounded up.
func checkCoolDownLeft(t *testing.T, what string, h http.Header) {
	t.Helper()
	if s, err := strconv.Atoi(h.Get("Retry-After")); err != nil || s > 3600 || s < 3500 {
		t.Errorf("%s: Retry-After %q, want the rest of an hour's cool-down", what, h.Get("Retry-After"))
	}
}

// A label that no connected worker's backend lists (a misspelt model name, say) is
// answered 503 at once, not held until its deadline (once the fleet has settled: a
// nanosecond here).
func TestLabelNoWorkerCanLoadAnswers503(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Scheduler: scheduler.Config{FleetSettle: time.Nanosecond}})
	w := b.dialHello(&pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: "w1", MaxLabels: 2, Slots: 1, LoadableLabels: []string{"resnet50"}})
	code, out := b.post("/run-task", `{"task_id":"nl-1","task_type":"x","label":"resnet-50"}`)
	if msg, _ := out["error"].(string); code != 503 || !strings.Contains(msg, `no connected worker can load label "resnet-50"`) {
		t.Fatalf("task for a label no worker can load: %d %v", code, out)
	}
	// Asynchronous too (it was told 202 with status failed and no error).
	code, out = b.post("/run-task", `{"task_id":"nl-1a","task_type":"x","label":"resnet-50","return_result":false}`)
	if msg, _ := out["error"].(string); code != 503 || !strings.Contains(msg, `no connected worker can load label "resnet-50"`) {
		t.Fatalf("async task for a label no worker can load: %d %v", code, out)
	}
	ans := b.postAsync(`{"task_id":"nl-2","task_type":"x","label":"resnet50"}`)
	a := w.assignment()
	w.finish(a, true, `"ok"`)
	if got := <-ans; got.status != 200 {
		t.Fatalf("task for the label the worker can load: %v", got)
	}
}

// A label the worker's backend gains while connected (a model added to Triton's
// repository), reported in an Inventory frame, is routed to it at once; the Welcome
// says the dispatcher takes the frame.
func TestInventoryMakesANewLabelRoutable(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Scheduler: scheduler.Config{FleetSettle: time.Nanosecond}})
	w := b.dialRaw("w1")
	w.write(&pb.Envelope{Body: &pb.Envelope_Hello{Hello: &pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: "w1", MaxLabels: 2, Slots: 1, LoadableLabels: []string{"resnet50"}}}})
	if wel := w.read().GetWelcome(); !wel.GetInventoryUpdates() {
		t.Fatalf("welcome %v does not offer inventory updates", wel)
	}
	// The Welcome is queued as the worker is registered (addWorker).
	if ids := b.workers(); !contains(ids, "w1") {
		t.Fatalf("w1 welcomed but /workers lists %q", ids)
	}
	if code, out := b.post("/run-task", `{"task_id":"inv-1","task_type":"x","label":"bert"}`); code != 503 {
		t.Fatalf("task for a label not yet in the repository: %d %v", code, out)
	}
	w.write(&pb.Envelope{Body: &pb.Envelope_Inventory{Inventory: &pb.Inventory{LoadableLabels: []string{"resnet50", "bert"}}}})
	w.write(&pb.Envelope{Body: &pb.Envelope_LabelEvent{LabelEvent: &pb.LabelEvent{Kind: pb.LabelEvent_KIND_LOADED, Label: "resnet50"}}})
	// w1's frames are handled in order: once a task's result, written after these two,
	// has answered the producer, the inventory and the event have been handled.
	synced := b.postAsync(`{"task_id":"inv-sync","task_type":"x","label":"resnet50"}`)
	w.finish(w.assignment(), true, `"ok"`)
	if got := <-synced; got.status != 200 {
		t.Fatalf("task for resnet50: %v", got)
	}
	if _, labels := b.get("/labels"); fmt.Sprint(labels["resnet50"]) != "[w1]" {
		t.Fatalf("/labels %v after w1 said it loaded resnet50", labels)
	}
	code, det := b.get("/workers?detail=true")
	if ws, _ := det["workers"].([]any); code != 200 || len(ws) != 1 || fmt.Sprint(ws[0].(map[string]any)["loadable"]) != "[bert resnet50]" {
		t.Fatalf("/workers?detail=true after the Inventory: %d %v, want loadable [bert resnet50]", code, det)
	}
	ans := b.postAsync(`{"task_id":"inv-2","task_type":"x","label":"bert"}`)
	a := w.assignment()
	if a.GetLabel() != "bert" {
		t.Fatalf("assignment %v", a)
	}
	w.finish(a, true, `"ok"`)
	if got := <-ans; got.status != 200 {
		t.Fatalf("task for the label the repository gained: %v", got)
	}
}

// A task submitted while the fleet is changing, for a label no worker's backend lists,
// is answered 503 once the fleet has settled, not held until its deadline; its
// queue_ms is the time it waited.
func TestQueuedTaskNoWorkerCanLoadAnswers503OnceSettled(t *testing.T) {
	t.Parallel()
	// Long enough that the submission lands within it after the worker connects.
	b := setup(t, Config{Scheduler: scheduler.Config{FleetSettle: time.Second}})
	b.dialHello(&pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: "w1", MaxLabels: 2, Slots: 1, LoadableLabels: []string{"resnet50"}})
	ans := b.postAsync(`{"task_id":"typo-1","task_type":"x","label":"resnet-50","timeout_ms":60000}`)
	got := <-ans
	if msg, _ := got.body["error"].(string); got.status != 503 || !strings.Contains(msg, `no connected worker can load label "resnet-50"`) {
		t.Fatalf("task for a label no worker can load, submitted within FleetSettle: %v", got)
	}
	if code, v := b.get("/tasks/typo-1"); code != 200 || v["status"] != "failed" || v["queue_ms"].(float64) <= 0 {
		t.Fatalf("GET /tasks/typo-1: %d %v, want failed with the time it queued", code, v)
	}
}
