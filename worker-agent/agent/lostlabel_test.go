package agent_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

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
