package agent_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
	"github.com/smartroute/smartroute/worker-agent/backend"
	"github.com/smartroute/smartroute/worker-agent/backend/backendtest"
)

// resultWithin reads frames until a task result or d passes. A timeout leaves p
// unusable for reading (gorilla), so call it last on p.
func resultWithin(p *peer, d time.Duration) (*pb.TaskResult, error) {
	_ = p.conn.SetReadDeadline(time.Now().Add(d))
	for {
		_, data, err := p.conn.ReadMessage()
		if err != nil {
			return nil, err
		}
		env, err := frame.Decode(data, 0)
		if err != nil {
			return nil, err
		}
		if r := env.GetResult(); r != nil {
			return r, nil
		}
	}
}

// reconnectedAfterLostAttempt starts an agent whose backend holds t1 until g opens
// (other tasks run at once), assigns t1 on a first connection, drops that connection
// while t1 runs (a network blip, a dispatcher restart), and returns the reconnected
// peer.
func reconnectedAfterLostAttempt(t *testing.T, opts ...option) (*harness, *gate, *peer) {
	t.Helper()
	g := newGate(t)
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		if task.ID == "t1" {
			return []byte(`{}`), g.hold(ctx, task.ID) // a long inference
		}
		return []byte(`{}`), nil
	}
	h := setup(t, append([]option{withFake(fake)}, opts...)...)
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a"})
	g.waitStarted(t)
	_ = p.conn.NetConn().Close()
	return h, g, h.connect()
}

// An attempt whose connection was lost is cancelled: its result would be dropped (the
// dispatcher re-queued it when the connection ended, and drops results of attempts it
// no longer waits for). Left running, it pinned its label, so the new session's task
// that must evict that label waited for work nobody would receive.
func TestLostAttemptDoesNotPinItsLabelAgainstTheNewSession(t *testing.T) {
	t.Parallel()
	_, g, p2 := reconnectedAfterLostAttempt(t, withConfig(func(c *agent.Config) { c.MaxLabels = 1 }))
	if !slices.Equal(p2.hello.GetHeldLabels(), []string{"a"}) {
		t.Fatalf("hello held %q", p2.hello.GetHeldLabels())
	}
	// What the dispatcher does with a worker that says it is idle with one slot and
	// one label slot: a task for another label, evicting a.
	// t1 is held until g opens: a t2 that waits for it gets no result before then,
	// however long the read waits (waitLimit bounds only the failure).
	p2.assign(&pb.TaskAssignment{TaskId: "t2", Label: "b", EvictLabel: "a", Attempt: 1})
	r, err := resultWithin(p2, waitLimit)
	g.open()
	if err != nil {
		t.Fatalf("t2 got no result while the lost t1 was held (%v): it waits for t1", err)
	}
	if !r.GetOk() || r.GetTaskId() != "t2" {
		t.Fatalf("result %v", r)
	}
}

// The dispatcher re-queues a lost connection's attempts at the front, and the
// reconnected worker is idle and holds the label, so attempt 2 of the same task comes
// back to it. Attempt 1 left running made two runs at once, beyond --slots.
func TestLostAttemptDoesNotRunBesideItsRetry(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	var running, peak atomic.Int32
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		return []byte(`{}`), g.hold(ctx, task.ID)
	}
	h := setup(t, withFake(fake)) // Slots 1
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a", Attempt: 1})
	g.waitStarted(t)
	_ = p.conn.NetConn().Close()

	p2 := h.connect()
	p2.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a", Attempt: 2})
	g.waitStarted(t)
	if got := peak.Load(); got > 1 {
		t.Errorf("%d runs at once on a worker with --slots 1 (attempt 1, whose result is dropped, still runs)", got)
	}
	g.open()
	if r := p2.result(); !r.GetOk() || r.GetAttempt() != 2 {
		t.Fatalf("result %v", r)
	}
}

// SIGTERM after a reconnect, with nothing running for the live session: the drain does
// not wait (--drain-timeout) for the lost session's attempt, whose result is dropped.
func TestShutdownDoesNotWaitForALostAttempt(t *testing.T) {
	t.Parallel()
	// A drain that waited for the lost t1 (held until the test ends) would outlast
	// the harness's waitLimit by far, and end by cancelling it: Run returns at all
	// only if the drain found nothing to wait for.
	h, _, p2 := reconnectedAfterLostAttempt(t, withConfig(func(c *agent.Config) { c.DrainTimeout = time.Hour }))
	if r := p2.run("t2", "a", ""); !r.GetOk() { // the new session is up
		t.Fatalf("t2: %v", r)
	}

	if err := h.stop(p2); err != nil {
		t.Fatalf("Run = %v", err)
	}
	drained, cancelled := 0, 0
	for _, r := range h.logRecords() {
		switch r["message"] {
		case "drained":
			drained++
		case "drain: cancelling the tasks still running; the dispatcher re-queues them":
			cancelled++
		}
	}
	if drained != 1 || cancelled != 0 {
		t.Errorf("drained logged %d times and the drain's cancel %d times; want 1 and 0", drained, cancelled)
	}
}

// A backend call that ignores cancellation still runs attempt 1 of t1 when the
// connection is lost. The dispatcher that the agent reconnects to may number the next
// run of t1 from 1 again: it forgets an overrun attempt's number when its worker
// leaves, and a restarted one never knew it. That assignment, on the new connection,
// is a new attempt, not a duplicate of the abandoned one, whose result nobody will
// read: ignored, it never ran and was never answered, and the task failed with 504 at
// its deadline.
func TestSameAttemptOnANewConnectionIsNoDuplicate(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	var calls atomic.Int32
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		if calls.Add(1) == 1 {
			return []byte(`{}`), g.hold(context.Background(), task.ID) // hung: ignores cancellation
		}
		return []byte(`{}`), nil
	}
	h := setup(t, withFake(fake))
	t.Cleanup(g.open) // before the harness's cleanup, which waits for the hung call
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a", Attempt: 1})
	g.waitStarted(t)
	_ = p.conn.NetConn().Close()

	p2 := h.connect()
	p2.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a", Attempt: 1})
	r := p2.result()
	g.open()
	if r.GetTaskId() != "t1" || r.GetAttempt() != 1 || !r.GetOk() {
		t.Fatalf("result %v, want t1 attempt 1 ok", r)
	}
	if got := calls.Load(); got != 2 {
		t.Errorf("%d backend runs, want 2: the hung one and the new attempt", got)
	}
}
