package agent_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
	"github.com/smartroute/smartroute/worker-agent/backend"
	"github.com/smartroute/smartroute/worker-agent/backend/backendtest"
)

// errLost is what Run says when the backend lost a label and could not load it again.
var errLost = fmt.Errorf("%w: model a restarted and failed to come back", backend.ErrNotLoaded)

// lostLabelSetup runs t1 and t2 on label a in two slots; t1's Run says the backend
// lost a (after the test opens lost), and t2's Run is gated by run. t1's result is
// returned: load_failed, which has the dispatcher drop a from this worker once t2 is
// done.
func lostLabelSetup(t *testing.T, run func(ctx context.Context) ([]byte, error)) (*harness, *peer, *gate) {
	t.Helper()
	g1 := newGate(t)
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		if task.ID == "t1" {
			if err := g1.hold(ctx, task.ID); err != nil {
				return nil, err
			}
			return nil, errLost
		}
		return run(ctx)
	}
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) { c.Slots, c.MaxLabels = 2, 2 }))
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a"})
	g1.waitStarted(t)
	p.assign(&pb.TaskAssignment{TaskId: "t2", Label: "a"})
	return h, p, g1
}

// checkLabelLeft checks that the agent, after the last task on a lost label ended,
// told the dispatcher EVICTED, unloaded the label, and leaves it out of the next hello.
func checkLabelLeft(t *testing.T, h *harness, p *peer) {
	t.Helper()
	p.event(pb.LabelEvent_KIND_EVICTED, "a")
	if got := h.fake.Unloads(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("unloads %q, want a", got)
	}
	_ = p.conn.NetConn().Close()
	if p2 := h.connect(); slices.Contains(p2.hello.GetHeldLabels(), "a") {
		t.Errorf("the next hello holds %q: the lost label stayed on the books", p2.hello.GetHeldLabels())
	}
}

// Two tasks run on a; the backend loses it during the first, while the second still
// runs. The label must leave with the second task (EVICTED), not stay on the books
// unannounced: counted against --max-labels, listed in the next hello, and missing from
// the view of the dispatcher, which dropped it on the first task's load_failed.
func TestLostLabelLeavesWithTheLastTaskOnIt(t *testing.T) {
	t.Parallel()
	g2 := newGate(t)
	h, p, g1 := lostLabelSetup(t, func(ctx context.Context) ([]byte, error) {
		return []byte(`{}`), g2.hold(ctx, "t2")
	})
	g2.waitStarted(t)
	g1.open()
	if r := p.result(); r.GetTaskId() != "t1" || !r.GetLoadFailed() {
		t.Fatalf("t1 %v, want load_failed", r)
	}
	g2.open()
	if r := p.result(); r.GetTaskId() != "t2" || !r.GetOk() {
		t.Fatalf("t2 %v, want ok", r)
	}
	checkLabelLeft(t, h, p)
}

// As above, with the second task cancelled just as its Run, too, finds the label gone:
// its context ended, so its ErrNotLoaded is not taken as the label's loss, and the
// label must still leave with it.
func TestLostLabelLeavesWithACancelledLastTask(t *testing.T) {
	t.Parallel()
	g2 := newGate(t)
	h, p, g1 := lostLabelSetup(t, func(ctx context.Context) ([]byte, error) {
		_ = g2.hold(ctx, "t2") // until cancelled
		return nil, errLost
	})
	g2.waitStarted(t)
	g1.open()
	if r := p.result(); r.GetTaskId() != "t1" || !r.GetLoadFailed() {
		t.Fatalf("t1 %v, want load_failed", r)
	}
	p.send(&pb.Envelope{Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{TaskId: "t2", Reason: "test"}}})
	if r := p.result(); r.GetTaskId() != "t2" || r.GetOk() || r.GetError() != "cancelled: test" {
		t.Fatalf("t2 %v, want cancelled", r)
	}
	checkLabelLeft(t, h, p)
}

// One task runs on a, and is cancelled just as its Run finds the label gone (Triton's
// reload, which outlives the task, failed). The result says cancelled, and the label
// must still leave the books (EVICTED), not stay held unannounced.
func TestLostLabelLeavesWhenItsTaskWasCancelled(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		_ = g.hold(ctx, task.ID) // until cancelled
		return nil, errLost
	}
	h := setup(t, withFake(fake))
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a"})
	g.waitStarted(t)
	p.send(&pb.Envelope{Body: &pb.Envelope_Cancel{Cancel: &pb.Cancel{TaskId: "t1", Reason: "test"}}})
	if r := p.result(); r.GetOk() || r.GetError() != "cancelled: test" || r.GetLoadFailed() {
		t.Fatalf("t1 %v, want cancelled, not load_failed", r)
	}
	checkLabelLeft(t, h, p)
}

// The backend loses a while t2 still runs on it. The dispatcher must hear EVICTED at
// once, not when t2 ends: t1's result says load_failed only when t1 was not cancelled
// meanwhile, and until it hears, it sends a's tasks here as hits. A task that comes for
// a all the same (its assignment crossed the event) is no hit on a label the backend
// does not hold: it waits for t2 to let go of a and loads a again, a miss.
func TestLostLabelIsAnnouncedAtOnceAndTakesNoNewHit(t *testing.T) {
	t.Parallel()
	g1, g2 := newGate(t), newGate(t)
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		switch task.ID {
		case "t1":
			if err := g1.hold(ctx, task.ID); err != nil {
				return nil, err
			}
			return nil, errLost
		case "t2":
			return []byte(`{}`), g2.hold(ctx, task.ID)
		}
		return []byte(`{}`), nil
	}
	onWait, waited := signal(t)
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) {
		c.Slots, c.MaxLabels = 3, 2
		agent.SetLabelHooks(c, nil, onWait)
	}))
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a"})
	g1.waitStarted(t)
	p.assign(&pb.TaskAssignment{TaskId: "t2", Label: "a"})
	g2.waitStarted(t)
	g1.open()
	if r := p.result(); r.GetTaskId() != "t1" || !r.GetLoadFailed() {
		t.Fatalf("t1 %v, want load_failed", r)
	}
	p.event(pb.LabelEvent_KIND_EVICTED, "a") // t2 is still held: only an event sent at once comes

	t3Sent := time.Now()
	p.assign(&pb.TaskAssignment{TaskId: "t3", Label: "a"})
	if l := waited(); l != "a" {
		t.Fatalf("t3 waited for %q, want a", l)
	}
	g2.open()
	results := map[string]*pb.TaskResult{} // t3 may answer first: t2's result goes out after it lets go of a
	for range 2 {
		r := p.result()
		results[r.GetTaskId()] = r
	}
	if r := results["t2"]; !r.GetOk() {
		t.Fatalf("t2 %v, want ok", r)
	}
	if r := results["t3"]; !r.GetOk() || !r.GetLabelMiss() {
		t.Fatalf("t3 %v, want ok with a label miss", r)
	}
	// Its load time counts from its arrival: an unset start reported the time since
	// the agent's process began, and taught the dispatcher that loads take that long.
	if d := time.Duration(results["t3"].GetLoadDurationUs()) * time.Microsecond; d > time.Since(t3Sent) {
		t.Fatalf("t3's load took %v by its result, more than the %v since it was sent", d, time.Since(t3Sent))
	}
	if got := fake.Loads("a"); got != 2 {
		t.Errorf("a loaded %d times, want 2: once for t1, again for t3 once t2 let go of it", got)
	}
	if got := h.fake.Unloads(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("unloads %q, want a (the lost copy, before t3's load)", got)
	}
	if got := count(p.eventKinds(), "EVICTED a"); got != 1 {
		t.Errorf("events %q: EVICTED a %d times, want once", p.eventKinds(), got)
	}
}

// A connection lost while a task whose backend call ignores cancellation still runs on
// a lost label: the next hello must not list that label, or the new dispatcher sends
// its tasks here as hits.
func TestLostLabelIsNotInTheNextHello(t *testing.T) {
	t.Parallel()
	g1, g2 := newGate(t), newGate(t)
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		switch task.ID {
		case "t1":
			if err := g1.hold(ctx, task.ID); err != nil {
				return nil, err
			}
			return nil, errLost
		case "t2":
			return []byte(`{}`), g2.hold(context.Background(), task.ID) // ignores cancellation
		}
		return []byte(`{}`), nil
	}
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) { c.Slots, c.MaxLabels = 2, 2 }))
	t.Cleanup(g2.open) // before the harness's cleanup, which waits for the hung t2
	p := h.connect()
	p.run("t0", "b", "") // b stays held
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a"})
	g1.waitStarted(t)
	p.assign(&pb.TaskAssignment{TaskId: "t2", Label: "a"})
	g2.waitStarted(t)
	g1.open()
	if r := p.result(); r.GetTaskId() != "t1" || !r.GetLoadFailed() {
		t.Fatalf("t1 %v, want load_failed", r)
	}
	_ = p.conn.NetConn().Close()
	p2 := h.connect()
	if got := p2.hello.GetHeldLabels(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("hello holds %q, want only b: a is lost, only the hung t2 still uses it", got)
	}
	g2.open()
}
