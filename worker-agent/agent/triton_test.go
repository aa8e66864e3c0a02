package agent_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
	"github.com/smartroute/smartroute/worker-agent/backend/triton"
	"github.com/smartroute/smartroute/worker-agent/backend/triton/fake"
)

// withTriton serves a fake Triton and points the agent's triton backend at it. The
// fake outlives the agent (cleanups run last-registered first).
func withTriton(t *testing.T, f *fake.Server) option {
	srv := httptest.NewServer(f)
	t.Cleanup(func() {
		f.Close()
		srv.Close()
	})
	return func(h *harness) {
		h.cfg.BackendName = triton.Name
		h.cfg.Triton = triton.Config{URL: srv.URL, PollInterval: time.Millisecond}
	}
}

// noKeepAlive sends the tests' own requests to the fake: another test's httptest Close
// closes the default transport's idle connections, failing a POST that had taken one.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// runTyped assigns one task of a type and returns its result.
func runTyped(p *peer, taskID, taskType, label, params string) *pb.TaskResult {
	p.t.Helper()
	p.assign(&pb.TaskAssignment{TaskId: taskID, TaskType: taskType, Label: label, ParametersJson: []byte(params)})
	r := p.result()
	if r.GetTaskId() != taskID {
		p.t.Fatalf("result for %q, want %q", r.GetTaskId(), taskID)
	}
	return r
}

const inferParams = `{"id":"r1","inputs":[{"name":"input_ids","shape":[1,3],"datatype":"INT64","data":[1,2,3]}],"outputs":[{"name":"sentence_embedding"}]}`

// awaitEvent reads fake events until want arrives.
func awaitEvent(t *testing.T, events <-chan string, want string) {
	t.Helper()
	timeout := time.After(waitLimit)
	for {
		select {
		case ev := <-events:
			if ev == want {
				return
			}
		case <-timeout:
			t.Fatalf("fake Triton event %q did not come", want)
		}
	}
}

func TestTritonColdLoadThenHit(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a", "b"}})
	h := setup(t, withTriton(t, f))
	p := h.connect()
	if got := p.hello.GetLoadableLabels(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("loadable_labels %q, want the repository index", got)
	}
	if len(p.hello.GetHeldLabels()) != 0 || !strings.Contains(p.hello.GetAgent(), "backend=triton") {
		t.Errorf("hello %v", p.hello)
	}

	r1 := runTyped(p, "t1", "infer", "a", inferParams)
	if !r1.GetOk() || !r1.GetLabelMiss() {
		t.Fatalf("first result %v, want ok with a label miss", r1)
	}
	var resp struct {
		ModelName string `json:"model_name"`
		Outputs   []struct{ Shape []int }
	}
	if err := json.Unmarshal(r1.GetResult(), &resp); err != nil || resp.ModelName != "a" || len(resp.Outputs) != 1 {
		t.Fatalf("result %s is not Triton's answer (%v)", r1.GetResult(), err)
	}
	if r1.GetLoadDurationUs() <= 0 {
		t.Errorf("load duration %dus on a miss", r1.GetLoadDurationUs())
	}
	r2 := runTyped(p, "t2", "infer", "a", inferParams)
	if !r2.GetOk() || r2.GetLabelMiss() || r2.GetLoadDurationUs() != 0 {
		t.Fatalf("second result %v, want ok without a load", r2)
	}
	if got := p.eventKinds(); !slices.Equal(got, []string{"LOADING a", "LOADED a"}) {
		t.Errorf("label events %q", got)
	}
	if n := f.LoadRequests("a"); n != 1 {
		t.Errorf("%d load requests, want 1", n)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestTritonEmbedTextsAndUnknownType(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"emb"}, Dim: 4})
	h := setup(t, withTriton(t, f))
	p := h.connect()
	r := runTyped(p, "t1", "embed_texts", "emb", `{"texts": ["text to process", "another"]}`)
	if !r.GetOk() {
		t.Fatalf("result %v", r)
	}
	var got struct{ Embeddings [][]float32 }
	if err := json.Unmarshal(r.GetResult(), &got); err != nil {
		t.Fatalf("result %s: %v", r.GetResult(), err)
	}
	if len(got.Embeddings) != 2 || !slices.Equal(got.Embeddings[0], f.Embedding("emb", "text to process")) ||
		!slices.Equal(got.Embeddings[1], f.Embedding("emb", "another")) {
		t.Fatalf("embeddings %v", got.Embeddings)
	}
	r = runTyped(p, "t2", "sample_task", "emb", `{"data":"sample"}`)
	if r.GetOk() || r.GetError() != `unknown task type "sample_task"; the triton backend runs infer and embed_texts` {
		t.Fatalf("result %v, want a clear unknown-task-type error", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestTritonEvictionWaitsForUnloading(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a", "b"}})
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) { c.MaxLabels = 1 }))
	p := h.connect()
	if r := runTyped(p, "t1", "infer", "a", inferParams); !r.GetOk() {
		t.Fatalf("result %v", r)
	}
	events := f.Subscribe()
	release := f.HoldUnloads("a")
	p.assign(&pb.TaskAssignment{TaskId: "t2", TaskType: "infer", Label: "b", ParametersJson: []byte(inferParams)})
	awaitEvent(t, events, "unload_start a")
	// The agent keeps reading the index while a is UNLOADING and loads nothing.
	awaitEvent(t, events, "index_unloading a")
	awaitEvent(t, events, "index_unloading a")
	if evs := f.Events(); slices.Contains(evs, "load_start b") {
		t.Fatalf("b started loading while a was UNLOADING: %q", evs)
	}
	release()
	r := p.result()
	if !r.GetOk() || !r.GetLabelMiss() || r.GetEvictedLabel() != "a" {
		t.Fatalf("result %v, want ok after evicting a", r)
	}
	evs := f.Events()
	if i, j := slices.Index(evs, "unloaded a"), slices.Index(evs, "load_start b"); i < 0 || j < i {
		t.Fatalf("fake events %q: b loaded before a left UNLOADING", evs)
	}
	if w := f.LoadsWhileUnloading(); len(w) > 0 {
		t.Fatalf("loads while unloading: %q", w)
	}
	if got := f.Loaded(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Triton holds %q, want b", got)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got := p.eventKinds(); !slices.Contains(got, "EVICTED a") {
		t.Errorf("label events %q lack EVICTED a", got)
	}
}

func TestTritonLoadFailure(t *testing.T) {
	t.Parallel()
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "current", true: "old-server"}[old], func(t *testing.T) {
			t.Parallel()
			f := fake.New(fake.Config{Models: []string{"bad", "good"}, OldErrors: old})
			f.FailLoads("bad", "CUDA out of memory")
			h := setup(t, withTriton(t, f))
			p := h.connect()
			r := runTyped(p, "t1", "infer", "bad", inferParams)
			if r.GetOk() || !strings.Contains(r.GetError(), "load failed for model 'bad'") ||
				!strings.Contains(r.GetError(), "CUDA out of memory") || !strings.Contains(r.GetError(), "HTTP 400") {
				t.Fatalf("result %v, want the task failed with Triton's message", r)
			}
			var failed *pb.LabelEvent
			for _, ev := range p.events {
				if ev.GetKind() == pb.LabelEvent_KIND_LOAD_FAILED && ev.GetLabel() == "bad" {
					failed = ev
				}
			}
			if failed == nil || !strings.Contains(failed.GetError(), "CUDA out of memory") {
				t.Fatalf("label events %v, want LOAD_FAILED bad with Triton's message", p.events)
			}
			// A folder removed after start: 500 from a current server, 400 from an old one.
			f.RemoveModel("good")
			r = runTyped(p, "t2", "infer", "good", inferParams)
			want := "HTTP 500"
			if old {
				want = "HTTP 400"
			}
			if r.GetOk() || !strings.Contains(r.GetError(), "failed to poll from model repository") || !strings.Contains(r.GetError(), want) {
				t.Fatalf("result %v, want Triton's missing-folder error with %s", r, want)
			}
			if err := h.stop(p); err != nil {
				t.Fatalf("Run = %v", err)
			}
		})
	}
}

func TestTritonGoesAwayAndComesBack(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"not-live", "down", "old-server"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			f := fake.New(fake.Config{Models: []string{"a"}, OldErrors: how == "old-server"})
			// The health check's own timeout is the interval: short enough for a quick
			// test, long enough for a loopback call under -race.
			h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) { c.HealthInterval = 200 * time.Millisecond }))
			p := h.connect()
			if r := runTyped(p, "t1", "infer", "a", inferParams); !r.GetOk() {
				t.Fatalf("result %v", r)
			}
			if how == "down" {
				f.SetDown(true)
			} else {
				f.SetLive(false)
			}
			// A health check that timed out on a loaded machine may have flapped the
			// status before Triton went away: skip statuses that still say accepting.
			st := p.status()
			for st.GetAccepting() {
				st = p.status()
			}
			if !strings.Contains(st.GetReason(), "triton is not live") {
				t.Fatalf("status %v, want not accepting because triton is not live", st)
			}
			r := runTyped(p, "t2", "infer", "a", inferParams)
			if r.GetOk() || !r.GetRefused() {
				t.Fatalf("result %v, want a refusal while Triton is away", r)
			}
			f.SetDown(false)
			f.SetLive(true)
			for st := p.status(); !st.GetAccepting(); st = p.status() {
				if !strings.Contains(st.GetReason(), "triton is not live") {
					t.Fatalf("status %v, want accepting again", st)
				}
			}
			if r := runTyped(p, "t3", "infer", "a", inferParams); !r.GetOk() || r.GetLabelMiss() {
				t.Fatalf("result %v, want ok on the label still loaded", r)
			}
			if err := h.stop(p); err != nil {
				t.Fatalf("Run = %v", err)
			}
		})
	}
}

func TestTritonLoadedModelsAtStartCount(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a", "b", "c", "d"}, Preload: []string{"a", "b", "c"}})
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) { c.MaxLabels = 2 }))
	p := h.connect()
	if got := p.hello.GetHeldLabels(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("held_labels %q, want a b", got)
	}
	if got := p.hello.GetLoadableLabels(); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Errorf("loadable_labels %q", got)
	}
	// The extra was unloaded, and fully, before the hello.
	if got, st := f.Loaded(), f.State("c"); !slices.Equal(got, []string{"a", "b"}) || st != fake.StateUnavailable {
		t.Errorf("Triton holds %q with c %s, want a b and c UNAVAILABLE", got, st)
	}
	// Held labels run without a load; a new one evicts one of them.
	if r := runTyped(p, "t1", "infer", "b", inferParams); !r.GetOk() || r.GetLabelMiss() {
		t.Fatalf("result %v, want ok without a load", r)
	}
	if r := runTyped(p, "t2", "infer", "d", inferParams); !r.GetOk() || !r.GetLabelMiss() || r.GetEvictedLabel() != "a" {
		t.Fatalf("result %v, want a miss evicting a", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestTritonWaitsForLiveAtStart(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a"}, Preload: []string{"a"}})
	f.SetLive(false)
	events := f.Subscribe()
	h := setup(t, withTriton(t, f))
	// The agent keeps asking and does not dial the dispatcher meanwhile.
	awaitEvent(t, events, "live_refused")
	awaitEvent(t, events, "live_refused")
	select {
	case <-h.conns:
		t.Fatal("the agent connected before Triton was live")
	default:
	}
	f.SetLive(true)
	p := h.connect()
	if got := p.hello.GetHeldLabels(); !slices.Equal(got, []string{"a"}) || p.hello.GetUnavailable() {
		t.Errorf("hello %v, want a held and available", p.hello)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestTritonConcurrentTasksShareOneLoad(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a"}})
	events := f.Subscribe()
	release := f.HoldLoads("a")
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) { c.Slots = 3 }))
	p := h.connect()
	for _, id := range []string{"t1", "t2", "t3"} {
		p.assign(&pb.TaskAssignment{TaskId: id, TaskType: "infer", Label: "a", ParametersJson: []byte(inferParams)})
	}
	awaitEvent(t, events, "load_start a")
	release()
	misses := 0
	for range 3 {
		r := p.result()
		if !r.GetOk() {
			t.Fatalf("result %v", r)
		}
		if r.GetLabelMiss() {
			misses++
		}
	}
	if misses != 1 || f.LoadRequests("a") != 1 || f.MaxConcurrentLoads("a") != 1 {
		t.Fatalf("%d misses, %d load requests, %d at once; want 1, 1, 1", misses, f.LoadRequests("a"), f.MaxConcurrentLoads("a"))
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestTritonFlags(t *testing.T) {
	t.Parallel()
	env := map[string]string{"TRITON_TEXT_INPUT": "text_input"}
	c, err := agent.ConfigFromArgs([]string{"--backend", "triton", "--triton-url", "http://triton:8000", "--triton-load-timeout", "3m",
		"--triton-embedding-output", "embedding"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.BackendName != "triton" || c.Triton.URL != "http://triton:8000" || c.Triton.LoadTimeout != 3*time.Minute ||
		c.Triton.TextInput != "text_input" || c.Triton.EmbeddingOutput != "embedding" ||
		c.Triton.UnloadTimeout != triton.DefaultUnloadTimeout || c.Triton.StartTimeout != triton.DefaultStartTimeout {
		t.Fatalf("config %+v", c.Triton)
	}
	d, err := agent.ConfigFromArgs(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.Triton.URL != "http://127.0.0.1:8000" || d.Triton.LoadTimeout != 10*time.Minute ||
		d.Triton.TextInput != "TEXT" || d.Triton.EmbeddingOutput != "sentence_embedding" {
		t.Fatalf("defaults %+v", d.Triton)
	}
}

// unloadBehindTheAgentsBack makes Triton lose label, as a restart does, and returns
// the fake's events from then on.
func unloadBehindTheAgentsBack(t *testing.T, h *harness, f *fake.Server, label string) <-chan string {
	t.Helper()
	events := f.Subscribe()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, h.cfg.Triton.URL+"/v2/repository/models/"+label+"/unload", nil)
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	awaitEvent(t, events, "unloaded "+label)
	return events
}

// Triton lost a loaded model (it restarted) and cannot load it again. The label must
// leave the agent's books and the dispatcher's view, and the task must say its label
// failed to load: kept as held, the label drew every task for it to this worker as a
// hit, and each failed there with a plain worker error, for good.
func TestTritonLostModelThatWillNotLoadAgainIsDropped(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a"}})
	h := setup(t, withTriton(t, f))
	p := h.connect()
	if r := runTyped(p, "t1", "infer", "a", inferParams); !r.GetOk() {
		t.Fatalf("t1 %v", r)
	}
	// Triton restarts without a; a no longer loads (its GPU memory is taken, say).
	f.FailLoads("a", "out of memory")
	unloadBehindTheAgentsBack(t, h, f, "a")

	p.events = nil
	r := runTyped(p, "t2", "infer", "a", inferParams)
	if r.GetOk() || !r.GetLoadFailed() || !strings.Contains(r.GetError(), "out of memory") {
		t.Fatalf("t2 %v, want load_failed with Triton's reason", r)
	}
	// The dispatcher hears that a is gone, after the result or before it.
	for !slices.Contains(p.eventKinds(), "EVICTED a") {
		env := p.read()
		ev := env.GetLabelEvent()
		if ev == nil {
			t.Fatalf("got %v, want EVICTED a", env)
		}
		p.events = append(p.events, ev)
	}
	// The next task on a is a miss, not a hit on a label that is not there.
	f.FailLoads("a", "")
	if r := runTyped(p, "t3", "infer", "a", inferParams); !r.GetOk() || !r.GetLabelMiss() {
		t.Fatalf("t3 %v, want ok after loading a again as a miss", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// Triton goes away between two health checks: the agent's connections to it are
// refused. A task then never reached Triton: it is refused (the dispatcher runs it
// elsewhere) rather than failed with a worker error, a load is not blamed on its label
// (three LOAD_FAILED events in a minute mark a label failing on every worker and fail
// its queued tasks), and the worker stops taking tasks at once, not at the next check.
func TestTritonRefusingConnectionsRefusesTasks(t *testing.T) {
	t.Parallel()
	for _, label := range []string{"a", "b"} { // held, and one to load
		t.Run("label-"+label, func(t *testing.T) {
			t.Parallel()
			f := fake.New(fake.Config{Models: []string{"a", "b"}})
			srv := httptest.NewServer(f)
			t.Cleanup(f.Close)
			h := setup(t, func(h *harness) {
				h.cfg.BackendName = triton.Name
				// A fresh connection per call: a kept-alive one that Triton's end dropped
				// fails after the request was written, which says nothing sure.
				client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
				h.cfg.Triton = triton.Config{URL: srv.URL, PollInterval: time.Millisecond, Client: client}
				h.cfg.HealthInterval = time.Hour // the next check is far away
			})
			p := h.connect()
			if r := runTyped(p, "t1", "infer", "a", inferParams); !r.GetOk() {
				t.Fatalf("t1 %v", r)
			}
			srv.Close() // Triton's process is gone: connections are refused
			p.events = nil
			r := runTyped(p, "t2", "infer", label, inferParams)
			if r.GetOk() || !r.GetRefused() || r.GetLoadFailed() {
				t.Fatalf("t2 %v, want refused", r)
			}
			if slices.ContainsFunc(p.events, func(ev *pb.LabelEvent) bool { return ev.GetKind() == pb.LabelEvent_KIND_LOAD_FAILED }) {
				t.Errorf("events %q: a load that never reached Triton is counted against its label", p.eventKinds())
			}
			// Said before the result, so that the dispatcher does not send the task back.
			if !slices.ContainsFunc(p.statuses, func(st *pb.WorkerStatus) bool { return !st.GetAccepting() }) {
				t.Errorf("statuses %v before t2's result, want not accepting", p.statuses)
			}
			if r := runTyped(p, "t3", "infer", "a", inferParams); !r.GetRefused() {
				t.Fatalf("t3 %v, want refused while Triton is away", r)
			}
			if err := h.stop(p); err != nil {
				t.Fatalf("Run = %v", err)
			}
		})
	}
}

// A load whose index read keeps failing (the repository's volume is away) was never
// sent: its task is refused, to run elsewhere, and the label gets no LOAD_FAILED, which
// counts towards marking it failing on every worker.
func TestTritonUnreadableIndexIsNotTheLabelsFailure(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a"}})
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) { c.HealthInterval = time.Hour }))
	p := h.connect()
	f.FailIndex(1 << 30)
	r := runTyped(p, "t1", "infer", "a", inferParams)
	if r.GetOk() || !r.GetRefused() || r.GetLoadFailed() {
		t.Fatalf("t1 %v, want refused", r)
	}
	if slices.ContainsFunc(p.events, func(ev *pb.LabelEvent) bool { return ev.GetKind() == pb.LabelEvent_KIND_LOAD_FAILED }) {
		t.Errorf("events %q: a load never sent is counted against its label", p.eventKinds())
	}
	if n := f.LoadRequests("a"); n != 0 {
		t.Errorf("%d load requests, want none", n)
	}
	f.FailIndex(0)
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// The Triton client keeps an idle connection for each slot, so that a burst of tasks
// reuses the connections the last one opened. It kept Go's default of 2 per host: every
// burst beyond that dialled anew, a handshake per inference and TIME_WAIT sockets
// piling up on the agent's host.
func TestTritonKeepsAnIdleConnectionPerSlot(t *testing.T) {
	t.Parallel()
	const slots = 2 * triton.DefaultMaxIdleConns // the agent's own sizing, not the default
	f := fake.New(fake.Config{Models: []string{"m"}, Preload: []string{"m"}, Dim: 2})
	var newConns atomic.Int32
	arrived := make(chan struct{}, slots)
	var gate atomic.Pointer[chan struct{}]
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/infer") {
			arrived <- struct{}{}
			<-*gate.Load() // every task of the round is in flight at once
		}
		f.ServeHTTP(w, r)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			newConns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(func() { f.Close(); srv.Close() })
	h := setup(t, func(h *harness) {
		h.cfg.BackendName = triton.Name
		h.cfg.Triton = triton.Config{URL: srv.URL, PollInterval: time.Millisecond}
		h.cfg.Slots = slots
		h.cfg.HealthInterval = time.Hour // no other call during the rounds
		h.cfg.InventoryInterval = time.Hour
	})
	p := h.connect()
	awaitArrival := func() {
		t.Helper()
		select {
		case <-arrived:
		case <-time.After(waitLimit):
			t.Fatal("an inference did not reach Triton")
		}
	}
	// round runs a task in every slot at once and returns how many connections it
	// opened. With sequential, each task is assigned once the one before it reached
	// Triton, so that it takes an idle connection rather than dial while one is
	// being returned.
	round := func(n int, sequential bool) int32 {
		before := newConns.Load()
		g := make(chan struct{})
		gate.Store(&g)
		for i := range slots {
			p.assign(&pb.TaskAssignment{TaskId: fmt.Sprintf("r%d-t%d", n, i), TaskType: "infer", Label: "m", ParametersJson: []byte(inferParams)})
			if sequential {
				awaitArrival()
			}
		}
		if !sequential {
			for range slots {
				awaitArrival()
			}
		}
		close(g)
		for range slots {
			if r := p.result(); !r.GetOk() {
				t.Fatalf("result %v", r)
			}
		}
		return newConns.Load() - before
	}
	first := round(1, false)
	if second := round(2, true); second != 0 {
		t.Fatalf("round 1 of %d tasks at once opened %d connections to Triton; round 2 opened %d more: fewer were kept idle", slots, first, second)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// A Triton not started with --model-control-mode=explicit refuses every load: the
// worker is misconfigured, and no model is at fault. The task is refused (it runs
// elsewhere), the label gets no LOAD_FAILED (the dispatcher marked every label the
// worker was given failing fleet-wide), and the worker stays unavailable, saying how to
// fix it, until Triton takes loads.
func TestTritonNotInExplicitModeIsNoLabelsFailure(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a"}, NotExplicit: true})
	var loads atomic.Int32
	unloads := make(chan struct{}, 64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/load"):
			loads.Add(1)
		case strings.HasSuffix(r.URL.Path, "/unload"):
			select {
			case unloads <- struct{}{}:
			default:
			}
		}
		f.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { f.Close(); srv.Close() })
	h := setup(t, func(h *harness) {
		h.cfg.BackendName = triton.Name
		h.cfg.Triton = triton.Config{URL: srv.URL, PollInterval: time.Millisecond}
		h.cfg.HealthInterval = 10 * time.Millisecond
	})
	p := h.connect()
	const fix = "--model-control-mode=explicit"
	r := runTyped(p, "t1", "infer", "a", inferParams)
	if r.GetOk() || !r.GetRefused() || r.GetLoadFailed() || !strings.Contains(r.GetError(), fix) {
		t.Fatalf("t1 %v, want refused, naming %s", r, fix)
	}
	if slices.ContainsFunc(p.events, func(ev *pb.LabelEvent) bool { return ev.GetKind() == pb.LabelEvent_KIND_LOAD_FAILED }) {
		t.Errorf("events %q: Triton's mode is counted against the label", p.eventKinds())
	}
	if !slices.ContainsFunc(p.statuses, func(st *pb.WorkerStatus) bool { return !st.GetAccepting() && strings.Contains(st.GetReason(), fix) }) {
		t.Errorf("statuses %v before t1's result, want not accepting, naming %s", p.statuses, fix)
	}
	// The health checks ask Triton again (an unload of a, refused likewise) and keep the
	// worker unavailable: the next task is refused without a load.
	for range 2 {
		select {
		case <-unloads:
		case <-time.After(waitLimit):
			t.Fatal("no health check asked Triton again")
		}
	}
	before := loads.Load()
	if r := runTyped(p, "t2", "infer", "a", inferParams); !r.GetRefused() || loads.Load() != before {
		t.Fatalf("t2 %v after %d load requests, want refused by an unavailable worker, with none", r, loads.Load()-before)
	}
	f.SetNotExplicit(false) // Triton restarted with the flag
	if st := p.status(); !st.GetAccepting() {
		t.Fatalf("status %v once Triton takes loads, want accepting", st)
	}
	if r := runTyped(p, "t3", "infer", "a", inferParams); !r.GetOk() {
		t.Fatalf("t3 %v", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// A model added to Triton's repository while the agent runs is found by the inventory
// poll: the dispatcher hears of it in an Inventory frame (it said in its Welcome that
// it takes them), and tasks for it load it.
func TestTritonModelAddedIsToldToTheDispatcher(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a"}})
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) { c.InventoryInterval = 5 * time.Millisecond }))
	p := h.connectWith(&pb.Welcome{ProtocolVersion: frame.ProtocolVersion, DispatcherId: "d", InventoryUpdates: true})
	f.AddModel("b")
	if got := p.next().GetInventory().GetLoadableLabels(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("inventory %q, want a and b", got)
	}
	if r := runTyped(p, "t1", "infer", "b", inferParams); !r.GetOk() || !r.GetLabelMiss() {
		t.Fatalf("task on the added model: %v", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatal(err)
	}
}

// A dispatcher whose Welcome does not offer inventory updates would close the
// connection on the frame: it gets none, and hears of the new model in the next hello.
func TestTritonModelAddedReachesAnOlderDispatcherAtTheNextHello(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a"}})
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) { c.InventoryInterval = 5 * time.Millisecond }))
	p := h.connect()
	f.AddModel("b")
	// Once a task on b runs, the poll has seen b (p.result fails on any other frame,
	// an Inventory included).
	for i := 0; ; i++ {
		if r := runTyped(p, fmt.Sprintf("t%d", i), "infer", "b", inferParams); r.GetOk() {
			break
		} else if !strings.Contains(r.GetError(), "not loadable") {
			t.Fatalf("task on b before the poll saw it: %v", r)
		}
	}
	p.closeWith(int(pb.CloseCode_CLOSE_CODE_SHUTDOWN), "restart")
	if code := p.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_SHUTDOWN) {
		t.Fatalf("close code %d", code)
	}
	p = h.connect()
	if got := p.hello.GetLoadableLabels(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("hello after the reconnect lists %q, want a and b", got)
	}
	if err := h.stop(p); err != nil {
		t.Fatal(err)
	}
}

// Triton started on an empty repository (models uploaded later) lists no model: the
// worker says it is unavailable, and refuses a task it is sent anyway, instead of
// offering every label (an empty list's meaning on the wire) and failing each load,
// which would mark those labels failing fleet-wide. Once a model is uploaded, it tells
// the dispatcher the list, becomes available and runs the model's tasks.
func TestTritonEmptyRepositoryAtStartWaitsForModels(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{}) // no model folders yet
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) { c.InventoryInterval = 5 * time.Millisecond }))
	p := h.connectWith(&pb.Welcome{ProtocolVersion: frame.ProtocolVersion, DispatcherId: "d", InventoryUpdates: true})
	if !p.hello.GetUnavailable() {
		t.Fatalf("hello %v: want unavailable while the repository lists no model", p.hello)
	}
	if r := runTyped(p, "t1", "infer", "resnet50", inferParams); !r.GetRefused() || r.GetLoadFailed() {
		t.Fatalf("task before any model: %v, want refused", r)
	}
	for _, ev := range p.events {
		if ev.GetKind() == pb.LabelEvent_KIND_LOAD_FAILED {
			t.Fatalf("a load was tried: %v", ev)
		}
	}
	f.AddModel("resnet50")
	if got := p.next().GetInventory().GetLoadableLabels(); !slices.Equal(got, []string{"resnet50"}) {
		t.Fatalf("inventory %q, want resnet50", got)
	}
	if st := p.status(); !st.GetAccepting() {
		t.Fatalf("status after the upload: %v, want accepting", st)
	}
	if r := runTyped(p, "t2", "infer", "resnet50", inferParams); !r.GetOk() {
		t.Fatalf("task on the uploaded model: %v", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatal(err)
	}
}

// A repository that does not answer at start is asked again before the agent
// connects: without its list the worker would offer every label, and without what
// Triton holds it could load past MaxLabels.
func TestTritonIndexFailingAtStartIsAskedAgain(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a"}})
	f.FailIndex(2) // the first two index requests fail with 500
	h := setup(t, withTriton(t, f))
	p := h.connect()
	if got := p.hello.GetLoadableLabels(); !slices.Equal(got, []string{"a"}) || p.hello.GetUnavailable() {
		t.Fatalf("hello %v: want a, available", p.hello)
	}
	if err := h.stop(p); err != nil {
		t.Fatal(err)
	}
}
