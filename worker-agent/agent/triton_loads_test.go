package agent_test

import (
	"slices"
	"testing"
	"time"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
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
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) { c.Slots = 2 }))
	p := h.connect()
	if r := runTyped(p, "t0", "infer", "m", inferParams); !r.GetOk() || r.GetLabelMiss() {
		t.Fatalf("result %v", r)
	}
	// Triton loses m (restarted empty, or an operator unloaded it).
	events := unloadBehindTheAgentsBack(t, h, f, "m")
	release := f.HoldLoads("m")
	defer release()
	p.assign(&pb.TaskAssignment{TaskId: "t1", TaskType: "infer", Label: "m", ParametersJson: []byte(inferParams),
		DeadlineUnixMs: time.Now().Add(300 * time.Millisecond).UnixMilli()})
	awaitEvent(t, events, "load_start m")
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
