package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
	"github.com/smartroute/smartroute/worker-agent/backend"
	"github.com/smartroute/smartroute/worker-agent/backend/backendtest"
)

// gate holds backend calls until the test opens it.
type gate struct {
	started chan string
	release chan struct{}
	once    sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{started: make(chan string, 16), release: make(chan struct{})}
	t.Cleanup(g.open) // runs before the harness cleanup, which was registered earlier
	return g
}

func (g *gate) hold(ctx context.Context, name string) error {
	g.started <- name
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

func (g *gate) waitStarted(t *testing.T) string {
	t.Helper()
	select {
	case name := <-g.started:
		return name
	case <-time.After(waitLimit):
		t.Fatal("the gated call did not start")
		return ""
	}
}

// signal turns a hook into a channel the test can wait on.
func signal(t *testing.T) (func(string), func() string) {
	ch := make(chan string, 16)
	return func(label string) { ch <- label }, func() string {
		t.Helper()
		select {
		case l := <-ch:
			return l
		case <-time.After(waitLimit):
			t.Fatal("the awaited moment did not come")
			return ""
		}
	}
}

func TestLabelMissThenHit(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.connect()

	r1 := p.run("t1", "m1", "")
	if !r1.GetOk() || !r1.GetLabelMiss() || r1.GetAttempt() != 1 {
		t.Fatalf("first result %v, want ok with a label miss", r1)
	}
	if got := p.eventKinds(); !slices.Equal(got, []string{"LOADING m1", "LOADED m1"}) {
		t.Errorf("label events %q, want LOADING then LOADED", got)
	}
	var echo map[string]string
	if err := json.Unmarshal(r1.GetResult(), &echo); err != nil {
		t.Fatalf("result %s: %v", r1.GetResult(), err)
	}
	want := map[string]string{"task_id": "t1", "task_type": "sample_task", "label": "m1", "worker_id": h.cfg.WorkerID, "parameters_json": `{"data":"sample"}`}
	for k, v := range want {
		if echo[k] != v {
			t.Errorf("result %s = %q, want %q", k, echo[k], v)
		}
	}

	r2 := p.run("t2", "m1", "")
	if !r2.GetOk() || r2.GetLabelMiss() || r2.GetLoadDurationUs() != 0 || r2.GetEvictedLabel() != "" {
		t.Fatalf("second result %v, want ok without a miss", r2)
	}
	if len(p.events) != 2 {
		t.Errorf("a hit sent label events: %q", p.eventKinds())
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}

	// The records the benchmark parses.
	misses := h.recordsWith("event", "label_miss")
	if len(misses) != 1 {
		t.Fatalf("%d label_miss records, want 1", len(misses))
	}
	m := misses[0]
	if m["message"] != "label miss" || m["worker_id"] != h.cfg.WorkerID || m["task_id"] != "t1" || m["label"] != "m1" || m["level"] != "info" {
		t.Errorf("label miss record %v", m)
	}
	if _, ok := m["load_ms"].(float64); !ok {
		t.Errorf("label miss record has no float load_ms: %v", m)
	}
	done := h.recordsWith("event", "task_completed")
	if len(done) != 2 {
		t.Fatalf("%d task_completed records, want 2", len(done))
	}
	for _, rec := range done {
		if rec["message"] != "task completed" || rec["worker_id"] != h.cfg.WorkerID || rec["label"] != "m1" || rec["ok"] != true || rec["attempt"] != 1.0 || rec["level"] != "info" {
			t.Errorf("task completed record %v", rec)
		}
		for _, k := range []string{"load_ms", "run_ms", "total_ms"} {
			if _, ok := rec[k].(float64); !ok {
				t.Errorf("task completed record has no float %s: %v", k, rec)
			}
		}
		if rec["label_miss"] != (rec["task_id"] == "t1") {
			t.Errorf("record %v: label_miss is true only for t1", rec)
		}
		if _, ok := rec["error"]; ok {
			t.Errorf("a successful task logged an error: %v", rec)
		}
	}
}

func TestEvictLabelIsHonoured(t *testing.T) {
	t.Parallel()
	fake := backendtest.New()
	fake.MaxLoaded = 2
	h := setup(t, withFake(fake))
	p := h.connect()
	p.run("t1", "a", "")
	p.run("t2", "b", "") // a is the least recently used; the dispatcher names b anyway
	p.events = nil

	r := p.run("t3", "c", "b")
	if !r.GetOk() || !r.GetLabelMiss() || r.GetEvictedLabel() != "b" {
		t.Fatalf("result %v, want a miss that evicted b", r)
	}
	if got := p.eventKinds(); !slices.Equal(got, []string{"EVICTED b", "LOADING c", "LOADED c"}) {
		t.Errorf("label events %q", got)
	}
	if got := fake.Unloads(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("unloads %q, want [b]", got)
	}
	if r := p.run("t4", "a", ""); r.GetLabelMiss() {
		t.Errorf("a was evicted too: %v", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
	var logged bool
	for _, rec := range h.recordsWith("task_id", "t3") {
		logged = logged || (rec["event"] == "label_miss" && rec["evicted_label"] == "b")
	}
	if !logged {
		t.Errorf("no label miss record for t3 naming the evicted label")
	}
}

func TestLeastRecentlyUsedLabelIsEvicted(t *testing.T) {
	t.Parallel()
	fake := backendtest.New()
	fake.MaxLoaded = 2
	h := setup(t, withFake(fake))
	p := h.connect()
	p.run("t1", "a", "")
	p.run("t2", "b", "")
	p.run("t3", "a", "") // b is now the least recently used
	r := p.run("t4", "c", "")
	if r.GetEvictedLabel() != "b" {
		t.Fatalf("result %v, want b evicted", r)
	}
	if got := fake.Loaded(); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("loaded %q, want [a c]", got)
	}
	// The dispatcher naming a label that is not held changes nothing.
	r = p.run("t5", "d", "zzz")
	if r.GetEvictedLabel() != "a" {
		t.Errorf("result %v, want a evicted", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestConcurrentTasksShareOneLoad(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	fake := backendtest.New()
	fake.OnLoad = g.hold
	joined, waitJoined := signal(t)
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) {
		c.Slots = 2
		agent.SetLabelHooks(c, joined, nil)
	}))
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "x"})
	g.waitStarted(t)
	p.assign(&pb.TaskAssignment{TaskId: "t2", Label: "x"})
	if l := waitJoined(); l != "x" {
		t.Fatalf("joined a load of %q", l)
	}
	g.open()
	results := map[string]*pb.TaskResult{}
	for range 2 {
		r := p.result()
		results[r.GetTaskId()] = r
	}
	if !results["t1"].GetOk() || !results["t1"].GetLabelMiss() {
		t.Errorf("t1 %v, want ok with a miss", results["t1"])
	}
	if !results["t2"].GetOk() || results["t2"].GetLabelMiss() {
		t.Errorf("t2 %v, want ok and no miss of its own", results["t2"])
	}
	if n := fake.Loads("x"); n != 1 {
		t.Errorf("%d loads of x, want 1", n)
	}
	if got := p.eventKinds(); !slices.Equal(got, []string{"LOADING x", "LOADED x"}) {
		t.Errorf("label events %q", got)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestPinnedLabelIsNeverEvicted(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	fake := backendtest.New()
	fake.MaxLoaded = 1
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		if task.ID == "t1" {
			return []byte(`{}`), g.hold(ctx, task.ID)
		}
		return []byte(`{}`), nil
	}
	waiting, waitWaiting := signal(t)
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) {
		c.Slots, c.MaxLabels = 2, 1
		agent.SetLabelHooks(c, nil, waiting)
	}))
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a"})
	g.waitStarted(t)
	// The dispatcher even names a, which t1 is running on.
	p.assign(&pb.TaskAssignment{TaskId: "t2", Label: "b", EvictLabel: "a"})
	if l := waitWaiting(); l != "b" {
		t.Fatalf("waiting for room for %q", l)
	}
	if u := fake.Unloads(); len(u) != 0 {
		t.Fatalf("unloaded %q under a running task", u)
	}
	g.open()
	r1, r2 := p.result(), p.result()
	if r1.GetTaskId() != "t1" || !r1.GetOk() || r2.GetTaskId() != "t2" || !r2.GetOk() || r2.GetEvictedLabel() != "a" {
		t.Errorf("results %v then %v, want t1 ok, then t2 ok after evicting a", r1, r2)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestLoadFailure(t *testing.T) {
	t.Parallel()
	fake := backendtest.New()
	fake.OnLoad = func(_ context.Context, label string) error {
		if label == "bad" {
			return errors.New("model file missing")
		}
		return nil
	}
	h := setup(t, withFake(fake))
	p := h.connect()
	r := p.run("t1", "bad", "")
	if r.GetOk() || !strings.Contains(r.GetError(), "model file missing") || !r.GetLabelMiss() || !r.GetLoadFailed() {
		t.Fatalf("result %v, want the load error, marked load_failed", r)
	}
	if len(p.events) != 2 || p.events[1].GetKind() != pb.LabelEvent_KIND_LOAD_FAILED || !strings.Contains(p.events[1].GetError(), "model file missing") {
		t.Errorf("label events %v, want LOADING then LOAD_FAILED with the error", p.events)
	}
	if r := p.run("t2", "good", ""); !r.GetOk() || r.GetLoadFailed() {
		t.Errorf("after a failed load: %v", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
	rec := h.recordsWith("task_id", "t1")
	var found bool
	for _, r := range rec {
		if r["event"] == "task_completed" {
			found = r["ok"] == false && strings.Contains(r["error"].(string), "model file missing")
		}
	}
	if !found {
		t.Errorf("no failed task_completed record for t1 in %v", rec)
	}
}

// Backend text that is not UTF-8 (a frame's strings must be) is repaired rather than
// left to make the frame unencodable, which would drop the connection and bring the
// task back to fail the same way.
func TestInvalidUTF8FromTheBackendIsRepaired(t *testing.T) {
	t.Parallel()
	fake := backendtest.New()
	fake.OnLoad = func(_ context.Context, label string) error {
		if label == "bad" {
			return errors.New("load \xff failed")
		}
		return nil
	}
	fake.OnRun = func(context.Context, backend.Task) ([]byte, error) {
		return nil, errors.New("run \xfe failed")
	}
	h := setup(t, withFake(fake))
	p := h.connect()
	if r := p.run("t1", "bad", ""); !strings.Contains(r.GetError(), "load \uFFFD failed") {
		t.Errorf("load failure result error %q", r.GetError())
	}
	if ev := p.events[len(p.events)-1]; !strings.Contains(ev.GetError(), "load \uFFFD failed") {
		t.Errorf("LOAD_FAILED event error %q", ev.GetError())
	}
	if r := p.run("t2", "good", ""); !strings.Contains(r.GetError(), "run \uFFFD failed") {
		t.Errorf("run failure result error %q", r.GetError())
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v (the connection must have stayed up)", err)
	}
}

func TestCancelEndsTheAttempt(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		return nil, g.hold(ctx, task.ID)
	}
	h := setup(t, withFake(fake))
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Attempt: 2, Label: "a"})
	g.waitStarted(t)
	p.send(&pb.Envelope{Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{TaskId: "t1", Attempt: 2, Reason: "producer went away"}}})
	r := p.result()
	if r.GetOk() || r.GetError() != "cancelled: producer went away" || r.GetAttempt() != 2 {
		t.Fatalf("result %v, want cancelled", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// The dispatcher drops the label it names for eviction from its view when it assigns.
// An attempt that gives up while that eviction runs sends its result first; if the
// unload then fails, the label is still loaded, and the dispatcher must hear so (a
// LOADED after the result), or it would not route the label here until the next hello.
func TestEvictionFailedAfterTheAttemptGaveUpIsTold(t *testing.T) {
	t.Parallel()
	unloading, release := make(chan struct{}), make(chan struct{})
	fake := backendtest.New()
	fake.OnUnload = func(_ context.Context, label string) error {
		close(unloading)
		<-release
		return errors.New("unload refused")
	}
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) { c.MaxLabels = 1 }))
	p := h.connect()
	if r := p.run("t1", "a", ""); !r.GetOk() {
		t.Fatalf("t1: %v", r)
	}
	p.assign(&pb.TaskAssignment{TaskId: "t2", Label: "b", EvictLabel: "a"})
	<-unloading
	p.send(&pb.Envelope{Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{TaskId: "t2", Attempt: 1, Reason: "producer went away"}}})
	if r := p.result(); r.GetTaskId() != "t2" || r.GetOk() {
		t.Fatalf("result %v, want t2 cancelled", r)
	}
	p.events = nil
	close(release)
	for {
		ev := p.read().GetLabelEvent()
		if ev == nil {
			t.Fatal("a frame other than a label event")
		}
		if ev.GetKind() == pb.LabelEvent_KIND_LOADED && ev.GetLabel() == "a" {
			break
		}
	}
	if r := p.run("t3", "a", ""); !r.GetOk() || r.GetLabelMiss() {
		t.Fatalf("t3 on the label kept: %v, want a hit", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// Another attempt that joined the load whose eviction failed also confirms the label
// kept, after its own result: the dispatcher's view still held that attempt's copy of
// the new label (doomed, in use) when the first LOADED came, and had no room for it.
func TestEvictionFailedIsToldAgainAfterAJoinedAttempt(t *testing.T) {
	t.Parallel()
	unloading, release, joined := make(chan struct{}), make(chan struct{}), make(chan struct{}, 1)
	fake := backendtest.New()
	fake.OnUnload = func(_ context.Context, label string) error {
		close(unloading)
		<-release
		return errors.New("unload refused")
	}
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) {
		c.MaxLabels, c.Slots = 1, 2
		agent.SetLabelHooks(c, func(string) { joined <- struct{}{} }, nil)
	}))
	p := h.connect()
	if r := p.run("t1", "a", ""); !r.GetOk() {
		t.Fatalf("t1: %v", r)
	}
	p.assign(&pb.TaskAssignment{TaskId: "t2", Label: "b", EvictLabel: "a"})
	<-unloading
	p.assign(&pb.TaskAssignment{TaskId: "t3", Label: "b"})
	<-joined
	p.send(&pb.Envelope{Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{TaskId: "t2", Attempt: 1, Reason: "producer went away"}}})
	if r := p.result(); r.GetTaskId() != "t2" || r.GetOk() {
		t.Fatalf("result %v, want t2 cancelled", r)
	}
	close(release)
	t3Done := false
	for {
		env := p.read()
		if r := env.GetResult(); r != nil {
			if r.GetTaskId() != "t3" || r.GetOk() || !r.GetLoadFailed() {
				t.Fatalf("result %v, want t3's load failed for want of room", r)
			}
			t3Done = true
			continue
		}
		if ev := env.GetLabelEvent(); t3Done && ev.GetKind() == pb.LabelEvent_KIND_LOADED && ev.GetLabel() == "a" {
			break
		}
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// A deadline that passes while the attempt runs cancels it, and the result says so;
// the one timer is re-armed for the attempt with the next deadline.
func TestDeadlineEndsTheRunningAttempt(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		return nil, g.hold(ctx, task.ID)
	}
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) { c.Slots = 2 }))
	p := h.connect()
	soon := time.Now().Add(50 * time.Millisecond)
	p.assign(&pb.TaskAssignment{TaskId: "later", Label: "a", DeadlineUnixMs: soon.Add(50 * time.Millisecond).UnixMilli()})
	g.waitStarted(t)
	p.assign(&pb.TaskAssignment{TaskId: "soon", Label: "a", DeadlineUnixMs: soon.UnixMilli()})
	g.waitStarted(t)
	for _, want := range []string{"soon", "later"} {
		r := p.result()
		if r.GetTaskId() != want || r.GetOk() || !r.GetDeadlineExceeded() || !strings.Contains(r.GetError(), "deadline exceeded") {
			t.Fatalf("result %v, want %s ended by its deadline", r, want)
		}
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestAssignmentBeyondSlotsFailsFast(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		return []byte(`{}`), g.hold(ctx, task.ID)
	}
	h := setup(t, withFake(fake))
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a"})
	g.waitStarted(t)
	p.assign(&pb.TaskAssignment{TaskId: "t2", Label: "a"})
	r := p.result()
	if r.GetTaskId() != "t2" || r.GetOk() || !r.GetRefused() || !strings.Contains(r.GetError(), "no free slot") {
		t.Fatalf("result %v, want t2 refused", r)
	}
	g.open()
	if r := p.result(); r.GetTaskId() != "t1" || !r.GetOk() {
		t.Fatalf("result %v, want t1 ok", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// An attempt that leaves loaded the label its assignment named for eviction says so
// after its result: the dispatcher dropped that label from its view when it assigned.
func TestKeptEvictionIsConfirmed(t *testing.T) {
	t.Parallel()
	h := setup(t, withConfig(func(c *agent.Config) { c.MaxLabels = 1 }))
	p := h.connect()
	if r := p.run("t1", "a", ""); !r.GetOk() || !r.GetLabelMiss() {
		t.Fatalf("t1: %v", r)
	}
	// Over before it began: no load, no eviction.
	p.assign(&pb.TaskAssignment{TaskId: "late", Label: "b", EvictLabel: "a", DeadlineUnixMs: time.Now().Add(-time.Second).UnixMilli()})
	if r := p.result(); r.GetTaskId() != "late" || !r.GetDeadlineExceeded() {
		t.Fatalf("late: %v", r)
	}
	p.events = nil
	if ev := p.read().GetLabelEvent(); ev.GetKind() != pb.LabelEvent_KIND_LOADED || ev.GetLabel() != "a" {
		t.Fatalf("after the result, want LOADED a, got %v", ev)
	}
	// An eviction that happened as assigned needs no word beyond its EVICTED event.
	if r := p.run("t2", "b", "a"); !r.GetOk() || r.GetEvictedLabel() != "a" {
		t.Fatalf("t2: %v", r)
	}
	if r := p.run("t3", "b", ""); !r.GetOk() {
		t.Fatalf("t3: %v", r)
	}
	if got := strings.Join(p.eventKinds(), ", "); got != "EVICTED a, LOADING b, LOADED b" {
		t.Fatalf("events %s", got)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestRefusedAssignments(t *testing.T) {
	t.Parallel()
	h := setup(t, withConfig(func(c *agent.Config) { c.Labels = []string{"a"} }))
	p := h.connect()
	for _, tc := range []struct {
		asg  *pb.TaskAssignment
		want string
	}{
		{&pb.TaskAssignment{TaskId: "late", Label: "a", DeadlineUnixMs: time.Now().Add(-time.Second).UnixMilli()}, "deadline exceeded"},
		{&pb.TaskAssignment{TaskId: "elsewhere", Label: "z"}, "not loadable"},
		{&pb.TaskAssignment{TaskId: "nolabel"}, "no label"},
	} {
		p.assign(tc.asg)
		r := p.result()
		if r.GetTaskId() != tc.asg.GetTaskId() || r.GetOk() || !strings.Contains(r.GetError(), tc.want) {
			t.Errorf("result %v, want an error containing %q", r, tc.want)
		}
		if late := tc.asg.GetTaskId() == "late"; r.GetDeadlineExceeded() != late {
			t.Errorf("%s: deadline_exceeded = %v, want %v", tc.asg.GetTaskId(), r.GetDeadlineExceeded(), late)
		}
	}
	if len(p.events) != 0 {
		t.Errorf("refused tasks caused label events %q", p.eventKinds())
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestResultsOfALostConnectionAreDiscarded(t *testing.T) {
	t.Parallel()
	h, g, p2 := reconnectedAfterLostAttempt(t)
	// t1 was cancelled with its connection: the dispatcher re-queued it.
	if r := p2.run("t2", "a", ""); !r.GetOk() {
		t.Fatalf("t2 on the new connection: %v", r)
	}
	g.open()
	h.cancel()
	if code := p2.closeCode(); code != 1000 {
		t.Errorf("close code %d, want 1000", code)
	}
	if err := h.wait(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	var discarded bool
	for _, r := range h.recordsWith("task_id", "t1") {
		if r["event"] == "task_completed" {
			t.Errorf("t1 logged as completed: %v", r)
		}
		discarded = discarded || r["event"] == "task_discarded"
	}
	if !discarded {
		t.Error("t1's result was not logged as discarded")
	}
}

func TestSimDurationsAreReported(t *testing.T) {
	t.Parallel()
	h := setup(t, withConfig(func(c *agent.Config) {
		c.Sim.LoadTime, c.Sim.RunTime = 20*time.Millisecond, 5*time.Millisecond
	}))
	p := h.connect()
	r := p.run("t1", "a", "")
	if !r.GetOk() || r.GetLoadDurationUs() < 20_000 || r.GetRunDurationUs() < 5_000 {
		t.Fatalf("result %v, want a load of at least 20ms and a run of at least 5ms", r)
	}
	if ev := p.events[len(p.events)-1]; ev.GetKind() != pb.LabelEvent_KIND_LOADED || ev.GetDurationUs() < 20_000 {
		t.Errorf("LOADED event %v, want a duration of at least 20ms", ev)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// BenchmarkTaskRoundTrip measures one assignment to result over a real WebSocket with
// the sim backend at zero durations: the agent's own overhead per task.
func BenchmarkTaskRoundTrip(b *testing.B) {
	h := setup(b, withConfig(func(c *agent.Config) { c.LogOutput = io.Discard; c.LogLevel = "info" }))
	p := h.connect()
	p.run("warm", "a", "")
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p.assign(&pb.TaskAssignment{TaskId: "t" + strconv.Itoa(i), Label: "a", ParametersJson: []byte(`{"data":"sample"}`)})
		if r := p.result(); !r.GetOk() {
			b.Fatalf("result %v", r)
		}
	}
	b.StopTimer()
	if err := h.stop(p); err != nil {
		b.Fatal(err)
	}
}
