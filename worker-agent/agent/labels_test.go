package agent

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/backend/backendtest"
)

const waitLimit = 10 * time.Second

// labelSetup returns a label manager over a fake backend, recording emitted events.
func labelSetup(t *testing.T, capacity int, fake *backendtest.Fake) (*labelManager, func() []string) {
	t.Helper()
	fake.MaxLoaded = capacity
	var mu sync.Mutex
	var events []string
	emit := func(ev *pb.LabelEvent) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev.GetKind().String()[len("KIND_"):]+" "+ev.GetLabel())
	}
	m := newLabelManager(t.Context(), fake, capacity, nil, zerolog.Nop(), emit)
	t.Cleanup(func() {
		m.wait()
		for _, v := range fake.Violations() {
			t.Errorf("backend contract broken: %s", v)
		}
	})
	return m, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(events)
	}
}

func mustAcquire(t *testing.T, m *labelManager, label, hint string) (*labelLease, acquireInfo) {
	t.Helper()
	l, info, err := m.acquire(t.Context(), label, hint, taskRef{id: "t-" + label})
	if err != nil {
		t.Fatalf("acquire %s: %v", label, err)
	}
	return l, info
}

// hook returns a hook function and a wait for its next call.
func hook(t *testing.T) (func(string), func() string) {
	ch := make(chan string, 16)
	return func(l string) { ch <- l }, func() string {
		t.Helper()
		select {
		case l := <-ch:
			return l
		case <-time.After(waitLimit):
			t.Fatal("hook not called")
			return ""
		}
	}
}

type acquired struct {
	lease *labelLease
	info  acquireInfo
	err   error
}

func goAcquire(ctx context.Context, m *labelManager, label, hint string) chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, info, err := m.acquire(ctx, label, hint, taskRef{id: "t-" + label})
		ch <- acquired{l, info, err}
	}()
	return ch
}

func await(t *testing.T, ch chan acquired) acquired {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(waitLimit):
		t.Fatal("acquire did not return")
		return acquired{}
	}
}

func TestHitMissAndRecency(t *testing.T) {
	t.Parallel()
	m, events := labelSetup(t, 2, backendtest.New())
	l, info := mustAcquire(t, m, "a", "")
	if !info.miss || info.joined || info.evicted != "" {
		t.Errorf("first acquire %+v, want a miss", info)
	}
	l.release()
	l, info = mustAcquire(t, m, "a", "")
	if info.miss || info.joined || info.wait != 0 {
		t.Errorf("second acquire %+v, want a plain hit", info)
	}
	l.release()
	l, _ = mustAcquire(t, m, "b", "")
	l.release()
	l, _ = mustAcquire(t, m, "a", "")
	l.release()
	if got := m.held(); !slices.Equal(got, []string{"b", "a"}) {
		t.Errorf("held %q, want [b a]", got)
	}
	_, info = mustAcquire(t, m, "c", "")
	if info.evicted != "b" {
		t.Errorf("evicted %q, want b", info.evicted)
	}
	want := []string{"LOADING a", "LOADED a", "LOADING b", "LOADED b", "EVICTED b", "LOADING c", "LOADED c"}
	if got := events(); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
}

func TestJoinersShareOneLoadAndItsFailure(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan struct{}, 4)
	fake := backendtest.New()
	fake.OnLoad = func(ctx context.Context, label string) error {
		started <- struct{}{}
		<-release
		return errors.New("no such model")
	}
	m, events := labelSetup(t, 2, fake)
	onJoin, joined := hook(t)
	m.onJoin = onJoin

	first := goAcquire(t.Context(), m, "x", "")
	<-started
	second := goAcquire(t.Context(), m, "x", "")
	joined()
	giveUpCtx, giveUp := context.WithCancel(t.Context())
	third := goAcquire(giveUpCtx, m, "x", "")
	joined()
	giveUp()
	if a := await(t, third); !errors.Is(a.err, context.Canceled) {
		t.Errorf("third = %v, want context.Canceled", a.err)
	}
	close(release)
	a1, a2 := await(t, first), await(t, second)
	if a1.err == nil || a2.err == nil || a1.err.Error() != a2.err.Error() {
		t.Fatalf("errors %v and %v, want the same load error", a1.err, a2.err)
	}
	if !a1.info.miss || a2.info.miss || !a2.info.joined {
		t.Errorf("infos %+v and %+v", a1.info, a2.info)
	}
	if n := fake.Loads("x"); n != 1 {
		t.Errorf("%d loads, want 1", n)
	}
	if got := events(); !slices.Equal(got, []string{"LOADING x", "LOAD_FAILED x"}) {
		t.Errorf("events %q", got)
	}
	// A failed load leaves no trace: the next acquire tries again.
	fake.OnLoad = nil
	l, info := mustAcquire(t, m, "x", "")
	l.release()
	if !info.miss {
		t.Errorf("retry %+v, want a miss", info)
	}
}

func TestALoadOutlivesTheTaskThatStartedIt(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	fake := backendtest.New()
	fake.OnLoad = func(ctx context.Context, label string) error {
		started <- struct{}{}
		<-release
		return nil
	}
	m, _ := labelSetup(t, 1, fake)
	ctx, cancel := context.WithCancel(t.Context())
	first := goAcquire(ctx, m, "x", "")
	<-started
	cancel()
	if a := await(t, first); !errors.Is(a.err, context.Canceled) {
		t.Fatalf("acquire = %v, want context.Canceled", a.err)
	}
	close(release)
	m.wait()
	if got := m.held(); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("held %q, want [x]: the load should complete", got)
	}
	// Nobody pins x, so it can make room.
	_, info := mustAcquire(t, m, "y", "")
	if info.evicted != "x" {
		t.Errorf("evicted %q, want x", info.evicted)
	}
}

func TestPinnedLabelsWaitForRoom(t *testing.T) {
	t.Parallel()
	m, _ := labelSetup(t, 2, backendtest.New())
	onWait, waiting := hook(t)
	m.onWait = onWait
	a, _ := mustAcquire(t, m, "a", "")
	b, _ := mustAcquire(t, m, "b", "")
	// The hint names a pinned label and there is no room: wait.
	c := goAcquire(t.Context(), m, "c", "a")
	if l := waiting(); l != "c" {
		t.Fatalf("waiting for %q", l)
	}
	b.release()
	got := await(t, c)
	if got.err != nil || got.info.evicted != "b" || got.info.wait == 0 {
		t.Fatalf("acquire c = %+v, want b evicted after a wait", got)
	}
	a.release()
	got.lease.release()
}

func TestAdoptKeepsWhatFitsAndUnloadsTheRest(t *testing.T) {
	t.Parallel()
	fake := backendtest.New()
	m, _ := labelSetup(t, 2, fake)
	if err := m.adopt(t.Context(), []string{"a", "b", "c"}); err != nil {
		t.Fatal(err)
	}
	if got := m.held(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("held %q", got)
	}
	if got := fake.Unloads(); !slices.Equal(got, []string{"c"}) {
		t.Errorf("unloads %q", got)
	}
}

func TestNotLoadableLabel(t *testing.T) {
	t.Parallel()
	m := newLabelManager(t.Context(), backendtest.New(), 1, []string{"a"}, zerolog.Nop(), func(*pb.LabelEvent) {})
	if _, _, err := m.acquire(t.Context(), "b", "", taskRef{}); !errors.Is(err, errNotLoadable) {
		t.Errorf("acquire = %v, want errNotLoadable", err)
	}
}

// The loadable labels change with the backend's repository: a label added loads, and
// one removed loads no more but keeps running tasks while it stays loaded.
func TestSetLoadable(t *testing.T) {
	t.Parallel()
	m := newLabelManager(t.Context(), backendtest.New(), 2, []string{"a"}, zerolog.Nop(), func(*pb.LabelEvent) {})
	m.setLoadable([]string{"a", "b"}, nil)
	lease, info, err := m.acquire(t.Context(), "b", "", taskRef{})
	if err != nil || !info.miss {
		t.Fatalf("acquire of the added label = %v, %+v; want a load", err, info)
	}
	lease.release()
	m.setLoadable([]string{"a"}, nil)
	lease, info, err = m.acquire(t.Context(), "b", "", taskRef{})
	if err != nil || info.miss {
		t.Fatalf("acquire of the removed label while loaded = %v, %+v; want a hit", err, info)
	}
	lease.release()
	if _, _, err := m.acquire(t.Context(), "c", "", taskRef{}); !errors.Is(err, errNotLoadable) {
		t.Errorf("acquire of a label never listed = %v, want errNotLoadable", err)
	}
}

// An unload that fails may leave the label in memory. Forgotten, its room was handed
// to the next load and the backend held one label more than capacity. It must stay
// counted as held, be no room for another label, and be unloaded by a later eviction.
// Both ways a label leaves: evicted to make room, and lost (Run said ErrNotLoaded).
func TestFailedUnloadKeepsTheLabelCounted(t *testing.T) {
	t.Parallel()
	refused := errors.New("unload refused")
	var fail sync.Map // label -> struct{}: its unloads fail
	fake := backendtest.New()
	fake.OnUnload = func(_ context.Context, label string) error {
		if _, ok := fail.Load(label); ok {
			return refused
		}
		return nil
	}
	m, events := labelSetup(t, 1, fake)
	fail.Store("a", struct{}{})
	l, _ := mustAcquire(t, m, "a", "")
	l.release()

	_, info, err := m.acquire(t.Context(), "b", "a", taskRef{id: "t-b"})
	var le *loadError
	if !errors.As(err, &le) || !errors.Is(err, refused) || info.evicted != "" {
		t.Fatalf("acquire b = %v, %+v; want a load error saying a could not be unloaded, nothing evicted", err, info)
	}
	if got := m.held(); !slices.Equal(got, []string{"a"}) || fake.Loads("b") != 0 {
		t.Fatalf("held %q after %d loads of b, want a and none", got, fake.Loads("b"))
	}
	l, info = mustAcquire(t, m, "a", "")
	if info.miss {
		t.Fatalf("acquire a %+v, want a hit on the label kept", info)
	}
	l.lost() // the backend lost a, and its unload fails again
	m.wait()
	if got := m.held(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("held %q after a lost label's unload failed, want a", got)
	}

	fail.Delete("a")
	l, info = mustAcquire(t, m, "b", "")
	l.release()
	if info.evicted != "a" {
		t.Fatalf("acquire b %+v, want a evicted", info)
	}
	want := []string{"LOADING a", "LOADED a", "EVICTED b", "EVICTED a", "LOADING b", "LOADED b"}
	if got := events(); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
}

// A lost label's room stays taken while its unload runs: if the unload fails, the
// label is put back, and a load that had taken the room meanwhile would leave the
// worker holding one label more than --max-labels.
func TestLostLabelKeepsItsRoomUntilUnloaded(t *testing.T) {
	t.Parallel()
	unloadStarted, letFail := make(chan struct{}), make(chan struct{})
	var first sync.Once
	fake := backendtest.New()
	fake.OnUnload = func(_ context.Context, label string) (err error) {
		first.Do(func() { // a's first unload fails; the retry works
			close(unloadStarted)
			<-letFail
			err = errors.New("unload refused")
		})
		return err
	}
	m, _ := labelSetup(t, 1, fake)
	fail := sync.OnceFunc(func() { close(letFail) })
	defer fail() // on a failure below too, so that the unload goroutine ends
	waiting := make(chan string, 8)
	m.onWait = func(label string) { waiting <- label }
	l, _ := mustAcquire(t, m, "a", "")
	l.lost()
	<-unloadStarted
	acquired := make(chan error, 1)
	go func() {
		lb, _, err := m.acquire(t.Context(), "b", "", taskRef{id: "tb"})
		if err == nil {
			lb.release()
		}
		acquired <- err
	}()
	select {
	case err := <-acquired:
		t.Fatalf("b acquired (err %v) while a's unload was still running, with room for one label", err)
	case <-waiting: // b waits for room
	}
	fail() // a is put back; b then evicts it, and that unload works
	if err := <-acquired; err != nil {
		t.Fatal(err)
	}
	m.wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := len(m.entries); n != 1 || m.entries["b"] == nil {
		t.Fatalf("holds %d labels (recency %v), want b alone", n, m.recency.Keys())
	}
}

// A hello sent while a label is being unloaded leaves it out; when that unload fails
// and the label stays, the dispatcher must hear LOADED, or it counts the worker a
// label short (room it does not have) until a later eviction.
func TestLabelKeptAfterAHelloLeftItOutIsConfirmed(t *testing.T) {
	t.Parallel()
	refused := errors.New("unload refused")
	unloading, release := make(chan struct{}), make(chan struct{})
	fake := backendtest.New()
	fake.OnUnload = func(context.Context, string) error {
		close(unloading)
		<-release
		return refused
	}
	m, events := labelSetup(t, 1, fake)
	l, _ := mustAcquire(t, m, "a", "")
	l.release()
	b := goAcquire(t.Context(), m, "b", "a")
	<-unloading
	var hello []string
	m.snapshot(func(held []string) { hello = held })
	if len(hello) != 0 {
		t.Fatalf("hello during a's unload holds %q, want none", hello)
	}
	close(release)
	if r := await(t, b); r.err == nil {
		t.Fatal("acquire b worked, want the unload's error")
	}
	// EVICTED b: b's load, which the dispatcher expects, did not happen. LOADED a: a
	// stayed, which the hello did not say.
	want := []string{"LOADING a", "LOADED a", "EVICTED b", "LOADED a"}
	if got := events(); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
}

// A label the backend lost while other tasks ran on it leaves the books at once
// (EVICTED, not held), but its room only with the last of them, however that one ends:
// kept, it would count against capacity and be listed in the next hello, and the
// dispatcher would go on sending its tasks here as hits until that task ended.
func TestLostLabelLeavesWithItsLastTask(t *testing.T) {
	t.Parallel()
	m, events := labelSetup(t, 1, backendtest.New())
	onWait, waited := hook(t)
	m.onWait = onWait
	first, _ := mustAcquire(t, m, "a", "")
	second, _ := mustAcquire(t, m, "a", "")
	first.lost()
	if got := m.held(); len(got) != 0 {
		t.Fatalf("held %q once a was lost, want none", got)
	}
	if want, got := []string{"LOADING a", "LOADED a", "EVICTED a"}, events(); !slices.Equal(got, want) {
		t.Fatalf("events %q once a was lost, want %q", got, want)
	}
	b := goAcquire(t.Context(), m, "b", "")
	if l := waited(); l != "b" {
		t.Fatalf("waited for %q, want b: a's room is taken while a task runs on it", l)
	}
	second.release() // as a task does that ends another way (cancelled, say)
	r := await(t, b)
	if r.err != nil || !r.info.miss || r.info.evicted != "" {
		t.Fatalf("acquire b %+v, %v: want a load into a's freed room", r.info, r.err)
	}
	r.lease.release()
	m.wait()
	if want, got := []string{"LOADING a", "LOADED a", "EVICTED a", "LOADING b", "LOADED b"}, events(); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q: EVICTED a once", got, want)
	}
}

// As above, with only the one task on a: the label leaves with it, once unloaded.
func TestLostLabelOfOneTaskLeavesWithIt(t *testing.T) {
	t.Parallel()
	m, events := labelSetup(t, 1, backendtest.New())
	first, _ := mustAcquire(t, m, "a", "")
	first.lost()
	m.wait()
	if got := m.held(); len(got) != 0 {
		t.Errorf("held %q after the last task on the lost label let go, want none", got)
	}
	if want, got := []string{"LOADING a", "LOADED a", "EVICTED a"}, events(); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	// Its room is free: b loads without waiting.
	l, info := mustAcquire(t, m, "b", "")
	l.release()
	if !info.miss || info.evicted != "" {
		t.Errorf("acquire b %+v, want a load into free room", info)
	}
}

// A label the dispatcher was told is lost (EVICTED while another task ran on it) whose
// unload then fails stays on the books, loaded: the dispatcher must hear LOADED, as
// for a label a hello left out while its unload ran, or its view lacks a label this
// worker counts against --max-labels.
func TestLostLabelKeptAfterAFailedUnloadIsConfirmed(t *testing.T) {
	t.Parallel()
	fake := backendtest.New()
	fake.OnUnload = func(context.Context, string) error { return errors.New("unload refused") }
	m, events := labelSetup(t, 1, fake)
	first, _ := mustAcquire(t, m, "a", "")
	second, _ := mustAcquire(t, m, "a", "")
	first.lost()
	second.release()
	m.wait()
	if got := m.held(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("held %q after the lost label's unload failed, want a", got)
	}
	if want, got := []string{"LOADING a", "LOADED a", "EVICTED a", "LOADED a"}, events(); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
}
