package agent_test

import (
	"context"
	"strings"
	"testing"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
	"github.com/smartroute/smartroute/worker-agent/backend"
	"github.com/smartroute/smartroute/worker-agent/backend/backendtest"
)

func TestDrainOnShutdownLetsTheRunningTaskFinish(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		return []byte(`{"done":true}`), g.hold(ctx, task.ID)
	}
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) { c.Slots = 2 }))
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a"})
	g.waitStarted(t)

	h.cancel() // SIGTERM
	if st := p.status(); st.GetAccepting() || st.GetReason() != "draining" {
		t.Fatalf("status %v, want not accepting, draining", st)
	}
	p.assign(&pb.TaskAssignment{TaskId: "t2", Label: "a"})
	if r := p.result(); r.GetTaskId() != "t2" || r.GetOk() || !r.GetRefused() || r.GetError() != "worker draining" {
		t.Fatalf("result %v, want t2 refused with worker draining", r)
	}
	g.open()
	if r := p.result(); r.GetTaskId() != "t1" || !r.GetOk() || string(r.GetResult()) != `{"done":true}` {
		t.Fatalf("result %v, want t1 ok", r)
	}
	if code := p.closeCode(); code != 1000 {
		t.Errorf("close code %d, want 1000 (normal)", code)
	}
	if err := h.wait(); err != nil {
		t.Fatalf("Run = %v, want nil after a drain", err)
	}
}

func TestDrainFrameStopsTheAgent(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.connect()
	p.run("t1", "a", "")
	p.send(&pb.Envelope{Body: &pb.Envelope_Drain{Drain: &pb.Drain{Reason: "scale down"}}})
	if st := p.status(); st.GetAccepting() {
		t.Fatalf("status %v, want not accepting", st)
	}
	if code := p.closeCode(); code != 1000 {
		t.Errorf("close code %d, want 1000", code)
	}
	if err := h.wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	var logged bool
	for _, r := range h.recordsWith("message", "draining: taking no new tasks") {
		logged = logged || strings.Contains(r["reason"].(string), "scale down")
	}
	if !logged {
		t.Error("the drain reason was not logged")
	}
}

func TestDrainTimeoutCancelsTasksWithoutResults(t *testing.T) {
	t.Parallel()
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		<-ctx.Done() // never finishes on its own
		return nil, ctx.Err()
	}
	started, waitStarted := signal(t)
	fake.OnLoad = func(context.Context, string) error { started("load"); return nil }
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) { c.DrainTimeout = 1 }))
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a"})
	waitStarted()
	h.cancel()
	// closeCode fails the test on any frame other than events and statuses: t1 must
	// not report a failure the dispatcher would pass on to the producer.
	if code := p.closeCode(); code != 1000 {
		t.Errorf("close code %d, want 1000", code)
	}
	if err := h.wait(); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestShutdownWhileDisconnectedReturnsNil(t *testing.T) {
	t.Parallel()
	h := setup(t, func(h *harness) { h.refuse = 503 })
	if err := h.stop(nil); err != nil {
		t.Fatalf("Run = %v", err)
	}
}
