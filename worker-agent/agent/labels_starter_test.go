package agent

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/backend/backendtest"
)

// gateCtx holds its second Err call (acquire's second pass, right after it started a
// load) until gate is closed: the scheduler running the load goroutine first.
type gateCtx struct {
	context.Context
	calls atomic.Int32
	gate  chan struct{}
}

func (c *gateCtx) Err() error {
	if c.calls.Add(1) == 2 {
		<-c.gate
	}
	return c.Context.Err()
}

// onEvent makes m signal the first event of kind on label.
func onEvent(m *labelManager, kind pb.LabelEvent_Kind, label string) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	emit := m.emit
	m.emit = func(ev *pb.LabelEvent) {
		emit(ev)
		if ev.GetKind() == kind && ev.GetLabel() == label {
			once.Do(func() { close(ch) })
		}
	}
	return ch
}

// The task that starts a load does not pin the entry it made until its next pass. If
// the load fails first, the task starts the same failing load again (two LOADING /
// LOAD_FAILED pairs to the dispatcher, twice the wait).
func TestLoadStarterGetsItsOwnLoadsFailure(t *testing.T) {
	t.Parallel()
	fake := backendtest.New()
	fake.OnLoad = func(context.Context, string) error { return errors.New("no such model") }
	m, events := labelSetup(t, 2, fake)
	ctx := &gateCtx{Context: t.Context(), gate: make(chan struct{})}
	failed := onEvent(m, pb.LabelEvent_KIND_LOAD_FAILED, "x")
	go func() { <-failed; close(ctx.gate) }()
	_, _, err := m.acquire(ctx, "x", "", taskRef{id: "t1"})
	if err == nil {
		t.Fatal("acquire succeeded")
	}
	if n := fake.Loads("x"); n != 1 {
		t.Errorf("%d loads of x for one acquire, want 1", n)
	}
	if got := events(); !slices.Equal(got, []string{"LOADING x", "LOAD_FAILED x"}) {
		t.Errorf("events %q", got)
	}
}

// If the load succeeds first, the label sits loaded with no pin, and another task's
// acquire may evict it before the task that loaded it runs; that task then loads it
// all over again.
func TestLoadStarterKeepsWhatItLoaded(t *testing.T) {
	t.Parallel()
	fake := backendtest.New()
	m, events := labelSetup(t, 1, fake)
	waiting := make(chan struct{}, 1)
	m.onWait = func(string) {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	ctx := &gateCtx{Context: t.Context(), gate: make(chan struct{})}
	loaded := onEvent(m, pb.LabelEvent_KIND_LOADED, "a")
	first := goAcquire(ctx, m, "a", "")
	<-loaded
	second := goAcquire(t.Context(), m, "b", "")
	var got acquired
	select {
	case got = <-second: // b took a's room before the task that loaded a used it
		if got.lease != nil {
			got.lease.release()
		}
	case <-waiting: // b waits for room: a is pinned for the task that loaded it
	}
	close(ctx.gate)
	a := await(t, first)
	if a.err != nil {
		t.Fatal(a.err)
	}
	a.lease.release()
	if got.lease == nil && got.err == nil {
		if b := await(t, second); b.err == nil {
			b.lease.release()
		}
	}
	if n := fake.Loads("a"); n != 1 {
		t.Errorf("a loaded %d times for one acquire, want 1; events %q", n, events())
	}
}
