package agent_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
	"github.com/smartroute/smartroute/worker-agent/backend/triton"
	"github.com/smartroute/smartroute/worker-agent/backend/triton/fake"
)

// When evicting a label does not finish (Triton keeps it UNLOADING past
// UnloadTimeout), the agent must not load the next label into room Triton has not
// freed: TRITON.md, "loading right after an unload before memory is released has
// crashed servers".
func TestTritonNoLoadIntoRoomNotFreed(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a", "b"}, Preload: []string{"a"}})
	release := f.HoldUnloads("a")
	defer release()
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) {
		c.MaxLabels = 1
		c.Triton.UnloadTimeout = 300 * time.Millisecond
	}))
	events := f.Subscribe()
	p := h.connect()
	p.assign(&pb.TaskAssignment{TaskId: "t1", TaskType: "infer", Label: "b", EvictLabel: "a", ParametersJson: []byte(inferParams)})
	// The agent's Unload of a gives up (a stays UNLOADING) and it says EVICTED a.
	for {
		env := p.read()
		if ev := env.GetLabelEvent(); ev != nil {
			p.events = append(p.events, ev)
			if ev.GetKind() == pb.LabelEvent_KIND_EVICTED && ev.GetLabel() == "a" {
				break
			}
			continue
		}
		if r := env.GetResult(); r != nil {
			t.Logf("result before a's eviction ended: ok=%v error=%q", r.GetOk(), r.GetError())
			break
		}
	}
	// The unload's own polling ended before EVICTED was sent, so a further index read
	// while a is UNLOADING shows the agent waiting before it loads b; a wrong agent
	// starts b's load instead.
	before := count(f.Events(), "index_unloading a")
	for ev := range events {
		if ev == "load_start b" || ev == "index_unloading a" && count(f.Events(), "index_unloading a") > before {
			break
		}
	}
	release() // Triton frees a's memory only now
	if w := f.LoadsWhileUnloading(); len(w) > 0 {
		t.Fatalf("Triton got a load while a model was still UNLOADING: %q", w)
	}
	if r := p.result(); !r.GetOk() || r.GetEvictedLabel() != "a" {
		t.Fatalf("result %v, want ok after evicting a", r)
	}
	evs := f.Events()
	if i, j := slices.Index(evs, "unloaded a"), slices.Index(evs, "load_start b"); j >= 0 && j < i {
		t.Fatalf("fake events %q: b loaded before a left UNLOADING", evs)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// The backend reloads a model Triton lost. A task whose deadline passes during that
// reload stops waiting for it, Triton goes on loading, and the next task's reload must
// not send a second load of the same model meanwhile.
func TestTritonReloadAbandonedByADeadlineIsNotLoadedTwice(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"m"}, Preload: []string{"m"}})
	// t1's deadline must pass after its reload started: a real deadline (300 ms) could
	// pass first on a loaded machine, and then no reload was abandoned. The test moves
	// the agent's deadline clock itself once the reload is under way.
	clock := newFakeClock()
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) {
		c.Slots = 2
		agent.SetDeadlineClock(c, clock)
	}))
	p := h.connect()
	if r := runTyped(p, "t0", "infer", "m", inferParams); !r.GetOk() || r.GetLabelMiss() {
		t.Fatalf("result %v", r)
	}
	// Triton loses m (restarted empty, or an operator unloaded it).
	events := unloadBehindTheAgentsBack(t, h, f, "m")
	release := f.HoldLoads("m")
	defer release()
	p.assign(&pb.TaskAssignment{TaskId: "t1", TaskType: "infer", Label: "m", ParametersJson: []byte(inferParams),
		DeadlineUnixMs: clock.Now().Add(time.Minute).UnixMilli()})
	awaitEvent(t, events, "load_start m")
	clock.Advance(2 * time.Minute) // t1's deadline passes during the reload
	if r := p.result(); r.GetOk() || !r.GetDeadlineExceeded() {
		t.Fatalf("result %v, want deadline exceeded", r)
	}
	p.assign(&pb.TaskAssignment{TaskId: "t2", TaskType: "infer", Label: "m", ParametersJson: []byte(inferParams)})
	select { // room for a second load request to reach Triton
	case <-events:
	case <-time.After(300 * time.Millisecond):
	}
	release()
	r := p.result()
	t.Logf("t2: ok=%v error=%q", r.GetOk(), r.GetError())
	if c := f.MaxConcurrentLoads("m"); c != 1 {
		t.Fatalf("%d loads of m under way at once: Triton loaded it twice", c)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// fakeClock is a deadline clock that moves only when Advance is called, which fires
// the timers that come due.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c  *fakeClock
	at time.Time // zero: stopped, or fired
	f  func()
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) agent.DeadlineTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	tm := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, tm)
	return tm
}

// Advance moves the clock on by d and runs, on this goroutine, the function of each
// timer that came due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	for _, tm := range c.timers {
		if !tm.at.IsZero() && !tm.at.After(c.now) {
			tm.at = time.Time{}
			due = append(due, tm.f)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

func (tm *fakeTimer) Reset(d time.Duration) bool {
	tm.c.mu.Lock()
	defer tm.c.mu.Unlock()
	active := !tm.at.IsZero()
	tm.at = tm.c.now.Add(d)
	return active
}

func (tm *fakeTimer) Stop() bool {
	tm.c.mu.Lock()
	defer tm.c.mu.Unlock()
	active := !tm.at.IsZero()
	tm.at = time.Time{}
	return active
}

// count is how many of events are ev.
func count(events []string, ev string) int {
	n := 0
	for _, e := range events {
		if e == ev {
			n++
		}
	}
	return n
}

// Triton fails to unload the label the agent evicts (an internal error, say): the model
// stays in memory. The agent dropped the label from its books anyway, told the
// dispatcher it was gone, and loaded the next label into room that was never freed:
// Triton held one model more than MaxLabels. The label must stay counted as held, the
// new label's task must run elsewhere (load_failed, not counted against that label),
// and a later eviction must try the unload again.
func TestTritonFailedUnloadKeepsTheLabel(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a", "b"}, Preload: []string{"a"}})
	var failUnloads atomic.Bool
	failUnloads.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failUnloads.Load() && strings.HasSuffix(r.URL.Path, "/unload") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"error":"failed to unload 'a': internal error"}`)
			return
		}
		f.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		f.Close()
		srv.Close()
	})
	h := setup(t, func(h *harness) {
		h.cfg.BackendName = triton.Name
		h.cfg.Triton = triton.Config{URL: srv.URL, PollInterval: time.Millisecond}
		h.cfg.MaxLabels = 1
	})
	p := h.connect()

	p.assign(&pb.TaskAssignment{TaskId: "t1", TaskType: "infer", Label: "b", EvictLabel: "a", ParametersJson: []byte(inferParams)})
	r := p.result()
	if r.GetOk() || !r.GetLoadFailed() || r.GetRefused() || r.GetEvictedLabel() != "" || !strings.Contains(r.GetError(), "internal error") {
		t.Fatalf("t1 %v, want load_failed saying a could not be unloaded", r)
	}
	if got := f.Loaded(); !slices.Equal(got, []string{"a"}) || f.LoadRequests("b") != 0 {
		t.Fatalf("Triton holds %q after %d load requests of b, want a alone and none", got, f.LoadRequests("b"))
	}
	// The dispatcher dropped a from its view when it named it for eviction; after the
	// result the agent says it holds a still, and never that a is gone.
	for !slices.Contains(p.eventKinds(), "LOADED a") {
		env := p.read()
		if env.GetLabelEvent() == nil {
			t.Fatalf("got %v, want LOADED a", env)
		}
		p.events = append(p.events, env.GetLabelEvent())
	}
	if got := p.eventKinds(); slices.Contains(got, "EVICTED a") || slices.Contains(got, "LOAD_FAILED b") {
		t.Fatalf("label events %q: a is not gone, and b's load did not fail", got)
	}
	if r := runTyped(p, "t2", "infer", "a", inferParams); !r.GetOk() || r.GetLabelMiss() {
		t.Fatalf("t2 %v, want ok on a, still held", r)
	}

	failUnloads.Store(false) // the next eviction tries again, and it works
	p.assign(&pb.TaskAssignment{TaskId: "t3", TaskType: "infer", Label: "b", EvictLabel: "a", ParametersJson: []byte(inferParams)})
	if r := p.result(); !r.GetOk() || r.GetEvictedLabel() != "a" {
		t.Fatalf("t3 %v, want ok after evicting a", r)
	}
	if got := f.Loaded(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Triton holds %q, want b", got)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}
