package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
	"github.com/smartroute/smartroute/worker-agent/backend"
	"github.com/smartroute/smartroute/worker-agent/backend/backendtest"
)

// heldLog is the agent's log output with one record held up: the first write that
// contains every one of match waits until release is called. It lets a test stop a
// goroutine at the log record it writes after deciding something, and see what the
// dispatcher has been told by then. Other writes pass. Release it in a defer, which
// runs before the harness's cleanup waits for the agent to stop.
type heldLog struct {
	out     syncBuffer
	match   [][]byte
	once    sync.Once
	held    chan struct{} // closed when the matching write arrives
	proceed chan struct{} // closed by release
}

func newHeldLog(t *testing.T, match ...string) *heldLog {
	l := &heldLog{held: make(chan struct{}), proceed: make(chan struct{})}
	for _, m := range match {
		l.match = append(l.match, []byte(m))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent logs:\n%s", l.out.String())
		}
	})
	return l
}

func (l *heldLog) Write(p []byte) (int, error) {
	all := true
	for _, m := range l.match {
		all = all && bytes.Contains(p, m)
	}
	first := false
	if all {
		l.once.Do(func() { first = true })
	}
	if first {
		close(l.held)
		<-l.proceed
	}
	return l.out.Write(p)
}

// release lets the held write go on. Only the test goroutine calls it.
func (l *heldLog) release() {
	select {
	case <-l.proceed:
	default:
		close(l.proceed)
	}
}

// waitHeld waits for the matching record to be held.
func (l *heldLog) waitHeld(t *testing.T, what string) {
	t.Helper()
	select {
	case <-l.held:
	case <-time.After(waitLimit):
		t.Fatalf("%s: the log record never came", what)
	}
}

// healthCalls is a fake backend that signals each Health call someone waits for.
type healthCalls struct {
	*backendtest.Fake
	calls chan struct{} // unbuffered: a call nobody waits for is not recorded
}

func (b healthCalls) Health(ctx context.Context) error {
	select {
	case b.calls <- struct{}{}:
	default:
	}
	return b.Fake.Health(ctx)
}

// A status is sent only on a change, so the last one the dispatcher reads must be the
// last change the agent made. A task whose Run finds the backend unreachable records
// "unavailable"; the health poller then finds it back and records "available". Both
// statuses must reach the dispatcher in that order, even when the task's goroutine is
// held up right after recording its change (here: at its log record).
func TestStatusesLeaveInTheOrderOfTheirChanges(t *testing.T) {
	t.Parallel()
	fake := backendtest.New()
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		if task.ID == "t1" {
			return nil, fmt.Errorf("%w: connection refused", backend.ErrUnavailable)
		}
		return []byte(`{}`), nil
	}
	logs := newHeldLog(t, `"backend availability changed"`, `"available":false`)
	defer logs.release()
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) {
		c.HealthInterval = 5 * time.Millisecond // the poller finds the backend healthy at once
		c.LogOutput = logs
	}))
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a"})
	logs.waitHeld(t, "t1 finding the backend unavailable")
	// t1 has recorded "unavailable"; the poller records "available" meanwhile.
	first := p.status()
	logs.release()
	if r := p.result(); r.GetTaskId() != "t1" || !r.GetRefused() {
		t.Fatalf("t1 result %v, want refused", r)
	}
	var second *pb.WorkerStatus
	if len(p.statuses) > 0 { // the second status came before t1's result
		second, p.statuses = p.statuses[0], p.statuses[1:]
	} else {
		second = p.status()
	}
	if r := p.run("t2", "a", ""); !r.GetOk() {
		t.Fatalf("t2 %v, want ok: the agent is available", r)
	}
	if first.GetAccepting() || !second.GetAccepting() || len(p.statuses) != 0 {
		t.Errorf("statuses accepting=%v (%q) then accepting=%v (%q), then %v; want false then true: the agent takes tasks, and the dispatcher's last word must say so",
			first.GetAccepting(), first.GetReason(), second.GetAccepting(), second.GetReason(), p.statuses)
	}
}

// The same with a drain: the health poller records "available" (not draining yet), a
// Drain frame then makes the agent say "draining". The poller's status must not
// follow "draining", or the dispatcher routes tasks to a worker that refuses them all
// until it closes.
func TestAvailableStatusNeverFollowsDraining(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	fake := backendtest.New()
	fake.SetHealth(fmt.Errorf("not live yet"))
	fake.OnRun = func(ctx context.Context, task backend.Task) ([]byte, error) {
		return []byte(`{}`), g.hold(ctx, task.ID)
	}
	health := healthCalls{Fake: fake, calls: make(chan struct{})}
	logs := newHeldLog(t, `"backend availability changed"`, `"available":true`)
	defer logs.release()
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) {
		c.Backend = health
		c.HealthInterval = 5 * time.Millisecond
		c.LogOutput = logs
	}))
	p := h.connect()
	if !p.hello.GetUnavailable() {
		t.Fatalf("hello %v, want unavailable", p.hello)
	}
	fake.SetHealth(nil)
	logs.waitHeld(t, "the poller finding the backend available")
	// A task keeps the drain going (assigned before the drain: the agent takes it).
	p.assign(&pb.TaskAssignment{TaskId: "t1", Label: "a"})
	g.waitStarted(t)
	p.send(&pb.Envelope{Body: &pb.Envelope_Drain{Drain: &pb.Drain{Reason: "test"}}})
	var statuses []*pb.WorkerStatus
	for st := (*pb.WorkerStatus)(nil); st.GetReason() != "draining"; {
		st = p.status()
		statuses = append(statuses, st)
	}
	logs.release()
	select { // the poller checks health again: its previous check has finished
	case <-health.calls:
	case <-time.After(waitLimit):
		t.Fatal("the poller did not check health again")
	}
	g.open() // t1 ends, and with it the drain: read all the dispatcher gets
	for {
		env, err := p.readErr()
		if err != nil {
			break // the drain's close
		}
		if st := env.GetStatus(); st != nil {
			statuses = append(statuses, st)
		}
	}
	if last := statuses[len(statuses)-1]; last.GetAccepting() {
		t.Errorf("statuses %v: the last says accepting after \"draining\", and the dispatcher routes tasks to a draining worker", statuses)
	}
}
