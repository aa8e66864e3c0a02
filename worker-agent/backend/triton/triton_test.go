package triton_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/smartroute/smartroute/worker-agent/backend"
	"github.com/smartroute/smartroute/worker-agent/backend/triton"
	"github.com/smartroute/smartroute/worker-agent/backend/triton/fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit bounds every wait; reaching it is a failure, never a signal.
const waitLimit = 10 * time.Second

type bundle struct {
	fake *fake.Server
	srv  *httptest.Server
	b    *triton.Backend
}

// setup serves a fake Triton holding models and returns a backend pointed at it.
func setup(t *testing.T, fcfg fake.Config, tune func(*triton.Config)) *bundle {
	t.Helper()
	return serve(t, fake.New(fcfg), nil, tune)
}

// serve serves f, through wrap when set, and returns a backend pointed at it.
func serve(t *testing.T, f *fake.Server, wrap func(http.Handler) http.Handler, tune func(*triton.Config)) *bundle {
	t.Helper()
	var h http.Handler = f
	if wrap != nil {
		h = wrap(f)
	}
	srv := httptest.NewServer(h)
	cfg := triton.Config{URL: srv.URL, PollInterval: time.Millisecond}
	if tune != nil {
		tune(&cfg)
	}
	b, err := triton.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		b.CloseIdleConnections()
		srv.Close()
	})
	return &bundle{fake: f, srv: srv, b: b}
}

// await reads events until want arrives.
func await(t *testing.T, events <-chan string, want string) {
	t.Helper()
	timeout := time.After(waitLimit)
	for {
		select {
		case ev := <-events:
			if ev == want {
				return
			}
		case <-timeout:
			t.Fatalf("event %q did not come", want)
		}
	}
}

func errorOf(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(waitLimit):
		t.Fatal("the call did not return")
		return nil
	}
}

func TestInventoryReadsTheIndex(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"c", "a", "b"}, Preload: []string{"b"}}, nil)
	if err := x.b.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	inv, err := x.b.Inventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(inv.Loadable, []string{"a", "b", "c"}) || !slices.Equal(inv.Loaded, []string{"b"}) {
		t.Fatalf("inventory %+v, want loadable a b c, loaded b", inv)
	}
}

// Loadable follows the repository as models are added and removed; a removed model
// still loaded stays listed until it is unloaded, as Triton lists it.
func TestLoadableFollowsTheRepository(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"a", "b"}, Preload: []string{"b"}}, nil)
	loadable := func() []string {
		t.Helper()
		l, err := x.b.Loadable(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	x.fake.AddModel("c")
	if got := loadable(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("after an upload: %q", got)
	}
	x.fake.RemoveModel("a")
	x.fake.RemoveModel("b")
	if got := loadable(); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("after removals: %q, want b (still loaded) and c", got)
	}
	x.fake.SetDown(true)
	if _, err := x.b.Loadable(t.Context()); err == nil {
		t.Fatal("Loadable with Triton down succeeded")
	}
}

func TestColdLoadThenInfer(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"m1"}, Dim: 3}, nil)
	task := backend.Task{ID: "t1", Type: triton.TaskInfer, Label: "m1",
		Params: []byte(`{"id":"r1","inputs":[{"name":"input_ids","shape":[2,2],"datatype":"INT64","data":[[1,2],[3,4]]}],"outputs":[{"name":"sentence_embedding"}]}`)}
	_, err := x.b.Run(t.Context(), task)
	var te *triton.Error
	if !errors.As(err, &te) || te.StatusCode != 404 || !strings.Contains(err.Error(), "unknown model") {
		t.Fatalf("Run before Load = %v, want Triton's 404", err)
	}
	if err := x.b.Load(t.Context(), "m1"); err != nil {
		t.Fatal(err)
	}
	if got := x.fake.State("m1"); got != fake.StateReady {
		t.Fatalf("state %q after Load", got)
	}
	out, err := x.b.Run(t.Context(), task)
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		ID        string `json:"id"`
		ModelName string `json:"model_name"`
		Outputs   []struct {
			Name     string
			Datatype string
			Shape    []int
			Data     []float32
		}
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("result %s: %v", out, err)
	}
	if resp.ID != "r1" || resp.ModelName != "m1" || len(resp.Outputs) != 1 ||
		!slices.Equal(resp.Outputs[0].Shape, []int{2, 3}) || len(resp.Outputs[0].Data) != 6 {
		t.Fatalf("result %s is not Triton's answer", out)
	}
	// Loading a loaded model is a no-op on Triton's side too.
	if err := x.b.Load(t.Context(), "m1"); err != nil {
		t.Fatal(err)
	}
	if n := x.fake.Loads("m1"); n != 1 {
		t.Errorf("model loaded %d times, want 1", n)
	}
}

func TestEmbedTexts(t *testing.T) {
	t.Parallel()
	for _, nested := range []bool{false, true} {
		t.Run(map[bool]string{false: "flat", true: "nested"}[nested], func(t *testing.T) {
			t.Parallel()
			x := setup(t, fake.Config{Models: []string{"emb"}, Preload: []string{"emb"}, Dim: 4}, nil)
			x.fake.SetNestedOutputs(nested)
			texts := []string{"hello", "wörld", `quote " and \ slash`}
			params, _ := json.Marshal(map[string]any{"texts": texts})
			out, err := x.b.Run(t.Context(), backend.Task{Type: triton.TaskEmbedTexts, Label: "emb", Params: params})
			if err != nil {
				t.Fatal(err)
			}
			var got struct{ Embeddings [][]float32 }
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("result %s: %v", out, err)
			}
			if len(got.Embeddings) != len(texts) {
				t.Fatalf("%d embeddings for %d texts: %s", len(got.Embeddings), len(texts), out)
			}
			for i, text := range texts {
				if want := x.fake.Embedding("emb", text); !slices.Equal(got.Embeddings[i], want) {
					t.Errorf("embedding of %q = %v, want %v", text, got.Embeddings[i], want)
				}
			}
		})
	}
}

func TestEmbedTextsErrors(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"emb"}, Preload: []string{"emb"}}, func(c *triton.Config) {
		c.EmbeddingOutput = "pooled"
	})
	for _, tc := range []struct{ params, want string }{
		{`{"texts": []}`, "at least one text"},
		{`{"text": "a"}`, "at least one text"},
		{`{"texts": [1]}`, `{"texts": ["...", ...]}`},
		// The fake has no output "pooled": Triton's message comes through.
		{`{"texts": ["a"]}`, "unexpected inference output 'pooled'"},
	} {
		_, err := x.b.Run(t.Context(), backend.Task{Type: triton.TaskEmbedTexts, Label: "emb", Params: []byte(tc.params)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("params %s: %v, want an error containing %q", tc.params, err, tc.want)
		}
	}
}

func TestUnknownTaskType(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"m"}, Preload: []string{"m"}}, nil)
	_, err := x.b.Run(t.Context(), backend.Task{Type: "sample_task", Label: "m", Params: []byte(`{}`)})
	want := `unknown task type "sample_task"; the triton backend runs infer and embed_texts`
	if err == nil || err.Error() != want {
		t.Fatalf("Run = %v, want %q", err, want)
	}
	_, err = x.b.Run(t.Context(), backend.Task{Type: triton.TaskInfer, Label: "m", Params: []byte(`{"inputs":[{}],"parameters":{"binary_data_output":true}}`)})
	if err == nil || !strings.Contains(err.Error(), "binary_data") {
		t.Fatalf("binary infer = %v, want a refusal", err)
	}
}

func TestConcurrentLoadsShareOneRequest(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"m"}}, nil)
	events := x.fake.Subscribe()
	release := x.fake.HoldLoads("m")
	joined := make(chan string, 6)
	triton.OnJoinedLoad(x.b, func(label string) { joined <- label })
	errs := make(chan error, 5)
	for range 5 {
		go func() { errs <- x.b.Load(t.Context(), "m") }()
	}
	await(t, events, "load_start m")
	// Every caller must have joined before the load is released; one that came later
	// would rightly start a load of its own.
	for range 5 {
		await(t, joined, "m")
	}
	// A caller that gives up does not abort the load the others wait for.
	ctx, cancel := context.WithCancel(t.Context())
	quit := make(chan error, 1)
	go func() { quit <- x.b.Load(ctx, "m") }()
	cancel()
	if err := errorOf(t, quit); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Load = %v", err)
	}
	release()
	for range 5 {
		if err := errorOf(t, errs); err != nil {
			t.Fatal(err)
		}
	}
	if n, c := x.fake.LoadRequests("m"), x.fake.MaxConcurrentLoads("m"); n != 1 || c != 1 {
		t.Fatalf("%d load requests, %d at once; want 1 and 1", n, c)
	}
}

func TestUnloadWaitsForUnloadingToEnd(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"a", "b"}, Preload: []string{"a"}}, nil)
	events := x.fake.Subscribe()
	release := x.fake.HoldUnloads("a")
	done := make(chan error, 1)
	go func() { done <- x.b.Unload(t.Context(), "a") }()
	await(t, events, "unload_start a")
	// The backend reads the index while a is UNLOADING, twice, and is still waiting.
	await(t, events, "index_unloading a")
	await(t, events, "index_unloading a")
	select {
	case err := <-done:
		t.Fatalf("Unload returned %v while a was UNLOADING", err)
	default:
	}
	// A load of a itself waits for the unload under way (one operation per model).
	loaded := make(chan error, 1)
	go func() { loaded <- x.b.Load(t.Context(), "a") }()
	release()
	if err := errorOf(t, done); err != nil {
		t.Fatal(err)
	}
	if err := errorOf(t, loaded); err != nil {
		t.Fatal(err)
	}
	evs := x.fake.Events()
	if i, j := slices.Index(evs, "unloaded a"), slices.Index(evs, "load_start a"); i < 0 || j < i {
		t.Fatalf("events %q: the load started before the unload ended", evs)
	}
	if w := x.fake.LoadsWhileUnloading(); len(w) > 0 {
		t.Fatalf("loads while unloading: %q", w)
	}
	// Unloading a model that is not loaded is a no-op.
	if err := x.b.Unload(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
}

func TestUnloadTimesOut(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"a"}, Preload: []string{"a"}}, func(c *triton.Config) {
		// The unload request itself must finish inside the timeout, even on a loaded
		// machine; the fake then holds the model in UNLOADING until the timeout passes.
		c.UnloadTimeout = 500 * time.Millisecond
	})
	defer x.fake.HoldUnloads("a")()
	err := x.b.Unload(t.Context(), "a")
	if err == nil || !strings.Contains(err.Error(), "still UNLOADING") || !errors.Is(err, backend.ErrUnloading) {
		t.Fatalf("Unload = %v, want a timeout saying the model is still UNLOADING (backend.ErrUnloading)", err)
	}
}

// A Load whose LoadTimeout passes while it waits for the model's lock (an Unload of
// it still polling a model stuck UNLOADING) says so: its text is what the dispatcher
// records as the label's load error, and a bare "context deadline exceeded" named
// neither the model nor what it waited for.
func TestLoadWaitingForTheLockSaysWhy(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"m"}, Preload: []string{"m"}}, func(c *triton.Config) {
		c.LoadTimeout = 50 * time.Millisecond
		c.UnloadTimeout = time.Hour
	})
	events := x.fake.Subscribe()
	release := x.fake.HoldUnloads("m")
	defer release()
	unloaded := make(chan error, 1)
	go func() { unloaded <- x.b.Unload(t.Context(), "m") }()
	await(t, events, "index_unloading m") // the Unload holds m's lock and polls
	err := x.b.Load(t.Context(), "m")
	release()
	if uerr := errorOf(t, unloaded); uerr != nil {
		t.Fatal(uerr)
	}
	want := `triton load "m": waiting for the operation under way: `
	if err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Load = %v, want %q and context.DeadlineExceeded", err, want+"...")
	}
}

// An unload Triton refuses leaves the model loaded: the agent goes on counting it as
// held, so the backend must go on treating it as its own and load it again when Triton
// loses it. It forgot it, and every task on the label failed with Triton's 404.
func TestFailedUnloadKeepsTheModelOurs(t *testing.T) {
	t.Parallel()
	var failUnloads atomic.Bool
	failUnloads.Store(true)
	x := serve(t, fake.New(fake.Config{Models: []string{"m"}}), func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if failUnloads.Load() && strings.HasSuffix(r.URL.Path, "/unload") {
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = w.Write([]byte(`{"error":"internal error"}`))
				return
			}
			next.ServeHTTP(w, r)
		})
	}, nil)
	if err := x.b.Load(t.Context(), "m"); err != nil {
		t.Fatal(err)
	}
	err := x.b.Unload(t.Context(), "m")
	if err == nil || errors.Is(err, backend.ErrUnloading) {
		t.Fatalf("Unload = %v, want a failure that is not backend.ErrUnloading", err)
	}
	failUnloads.Store(false)
	unloadBehindTheBackend(t, x) // Triton lost it (a restart, say)
	if _, err := x.b.Run(t.Context(), backend.Task{Type: triton.TaskInfer, Label: "m", Params: params}); err != nil {
		t.Fatalf("Run = %v, want m loaded again", err)
	}
}

func TestLoadFailuresCarryTritonsMessage(t *testing.T) {
	t.Parallel()
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "current", true: "old-server"}[old], func(t *testing.T) {
			t.Parallel()
			x := setup(t, fake.Config{Models: []string{"bad", "good"}, OldErrors: old}, nil)
			x.fake.FailLoads("bad", "CUDA out of memory")
			code := func(current int) int {
				if old {
					return 400
				}
				return current
			}
			var te *triton.Error
			err := x.b.Load(t.Context(), "bad")
			if !errors.As(err, &te) || te.StatusCode != 400 ||
				!strings.Contains(err.Error(), "load failed for model 'bad'") || !strings.Contains(err.Error(), "CUDA out of memory") {
				t.Errorf("failed load = %v", err)
			}
			err = x.b.Load(t.Context(), "missing")
			if !errors.As(err, &te) || te.StatusCode != code(500) || !strings.Contains(err.Error(), "failed to poll from model repository") {
				t.Errorf("load of a missing folder = %v", err)
			}
			_, err = x.b.Run(t.Context(), backend.Task{Type: triton.TaskInfer, Label: "good", Params: []byte(`{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}`)})
			if !errors.As(err, &te) || te.StatusCode != code(404) || !strings.Contains(err.Error(), "unknown model: 'good'") {
				t.Errorf("infer on an unloaded model = %v", err)
			}
			if err := x.b.Load(t.Context(), "good"); err != nil {
				t.Fatal(err)
			}
			_, err = x.b.Run(t.Context(), backend.Task{Type: triton.TaskInfer, Label: "good", Params: []byte(`{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","data":[1]}]}`)})
			if !errors.As(err, &te) || te.StatusCode != 400 || !strings.Contains(err.Error(), "unexpected number of elements") {
				t.Errorf("bad infer = %v", err)
			}
		})
	}
}

// A Triton not in explicit model-control mode refuses every load (503, or 400 from an
// old server, "explicit model load / unload is not allowed ..."): a misconfigured
// worker, not a failing model. The load fails as backend.ErrUnavailable naming the fix,
// which the agent does not count against the label (it sent LOAD_FAILED for every label
// it was given, and the dispatcher marked them failing fleet-wide), and Health fails
// until Triton takes loads again, so that the worker stays unavailable meanwhile.
func TestNotExplicitModeIsTheBackendUnavailable(t *testing.T) {
	t.Parallel()
	for _, old := range []bool{false, true} {
		t.Run(map[bool]string{false: "current", true: "old-server"}[old], func(t *testing.T) {
			t.Parallel()
			x := setup(t, fake.Config{Models: []string{"a"}, NotExplicit: true, OldErrors: old}, nil)
			if err := x.b.WaitStarted(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := x.b.Health(t.Context()); err != nil {
				t.Fatalf("Health before any load = %v", err)
			}
			const fix = "--model-control-mode=explicit"
			err := x.b.Load(t.Context(), "a")
			var te *triton.Error
			if !errors.Is(err, backend.ErrUnavailable) || !errors.As(err, &te) || !strings.Contains(err.Error(), fix) ||
				!strings.Contains(err.Error(), "explicit model load / unload is not allowed") {
				t.Fatalf("Load = %v, want backend.ErrUnavailable naming %s, with Triton's message", err, fix)
			}
			// Health asks again, and fails while Triton still refuses.
			for range 2 {
				if err := x.b.Health(t.Context()); err == nil || !strings.Contains(err.Error(), fix) {
					t.Fatalf("Health = %v while Triton refuses loads, want an error naming %s", err, fix)
				}
			}
			x.fake.SetNotExplicit(false) // restarted with the flag
			if err := x.b.Health(t.Context()); err != nil {
				t.Fatalf("Health = %v once Triton takes loads", err)
			}
			if err := x.b.Load(t.Context(), "a"); err != nil {
				t.Fatal(err)
			}
			if st := x.fake.State("a"); st != fake.StateReady {
				t.Fatalf("a is %q, want READY", st)
			}
		})
	}
}

// A load answered 503 without Triton's not-explicit message (a proxy before Triton
// with no healthy upstream) loaded nothing: the backend is unavailable, the model not
// at fault. Health, which has nothing to ask again, follows liveness.
func TestLoadAnswered503IsTheBackendUnavailable(t *testing.T) {
	t.Parallel()
	x := serve(t, fake.New(fake.Config{Models: []string{"a"}}), func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/load") {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte("no healthy upstream"))
				return
			}
			next.ServeHTTP(w, r)
		})
	}, nil)
	if err := x.b.Load(t.Context(), "a"); !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "no healthy upstream") {
		t.Fatalf("Load = %v, want backend.ErrUnavailable with the answer's text", err)
	}
	if err := x.b.Health(t.Context()); err != nil {
		t.Fatalf("Health = %v", err)
	}
}

func TestLoadTimeoutUnloadsAgain(t *testing.T) {
	t.Parallel()
	// The timeout covers the index read before the load too: 20 ms was not always
	// enough under -race on a busy host, and then no load was ever sent.
	x := setup(t, fake.Config{Models: []string{"big"}}, func(c *triton.Config) { c.LoadTimeout = 500 * time.Millisecond })
	events := x.fake.Subscribe()
	release := x.fake.HoldLoads("big")
	done := make(chan error, 1)
	go func() { done <- x.b.Load(t.Context(), "big") }()
	// The client gave up; Triton goes on loading, so the backend unloads it again.
	await(t, events, "unload_requested big")
	release()
	err := errorOf(t, done)
	if err == nil || !strings.Contains(err.Error(), "no answer within 500ms") {
		t.Fatalf("Load = %v, want a timeout", err)
	}
	if got := x.fake.State("big"); got != fake.StateUnavailable {
		t.Fatalf("state %q after a timed-out load, want UNAVAILABLE", got)
	}
}

func TestHealthFollowsLiveness(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"a"}}, nil)
	if err := x.b.Health(t.Context()); err != nil {
		t.Fatal(err)
	}
	x.fake.SetLive(false)
	if err := x.b.Health(t.Context()); err == nil || !strings.Contains(err.Error(), "triton is not live") {
		t.Fatalf("Health = %v while not live", err)
	}
	x.fake.SetLive(true)
	x.fake.SetDown(true)
	if err := x.b.Health(t.Context()); err == nil || !strings.Contains(err.Error(), "triton is not live") {
		t.Fatalf("Health = %v while down", err)
	}
	x.fake.SetDown(false)
	if err := x.b.Health(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Liveness, not readiness: a model loading does not make Triton unhealthy.
	events := x.fake.Subscribe()
	release := x.fake.HoldLoads("a")
	done := make(chan error, 1)
	go func() { done <- x.b.Load(t.Context(), "a") }()
	await(t, events, "load_start a")
	if err := x.b.Health(t.Context()); err != nil {
		t.Fatalf("Health = %v while a model loads", err)
	}
	release()
	if err := errorOf(t, done); err != nil {
		t.Fatal(err)
	}
}

func TestWaitStarted(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{}, func(c *triton.Config) { c.StartTimeout = time.Hour })
	x.fake.SetLive(false)
	done := make(chan error, 1)
	go func() { done <- x.b.WaitStarted(t.Context()) }()
	x.fake.SetLive(true)
	if err := errorOf(t, done); err != nil {
		t.Fatal(err)
	}

	y := setup(t, fake.Config{}, func(c *triton.Config) { c.StartTimeout = 20 * time.Millisecond })
	y.fake.SetDown(true)
	if err := y.b.WaitStarted(t.Context()); err == nil || !strings.Contains(err.Error(), "not live within 20ms") {
		t.Fatalf("WaitStarted = %v, want a timeout", err)
	}
}

// A model still LOADING when the agent starts (its previous process was stopped or
// killed while loading it; Triton goes on loading after the client is gone) ends up in
// memory. Inventory must count it, so WaitStarted waits for the load to settle:
// reported as not loaded, it held room the agent believed free, and the agent loaded
// one model more than its capacity. A failed index read (the repository's volume
// hiccups) is read again: WaitStarted gave up the wait on the first one.
func TestWaitStartedWaitsForALoadLeftUnderWay(t *testing.T) {
	t.Parallel()
	for _, failed := range []int{0, 1, 3} {
		t.Run(fmt.Sprintf("%d failed index reads", failed), func(t *testing.T) {
			t.Parallel()
			f := fake.New(fake.Config{Models: []string{"a", "b"}})
			release := f.HoldLoads("a")
			indexRead := make(chan struct{}, 8)
			x := serve(t, f, func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					next.ServeHTTP(w, r)
					if r.URL.Path == "/v2/repository/index" {
						indexRead <- struct{}{} // answered
					}
				})
			}, func(c *triton.Config) { c.StartTimeout = time.Hour })
			b, srv := x.b, x.srv
			// The previous agent's load, which nobody waits for any more.
			events := f.Subscribe()
			lctx, cancelLoad := context.WithCancel(t.Context())
			loadDone := make(chan struct{})
			go func() {
				defer close(loadDone)
				req, _ := http.NewRequestWithContext(lctx, http.MethodPost, srv.URL+"/v2/repository/models/a/load", nil)
				if resp, err := srv.Client().Do(req); err == nil {
					_ = resp.Body.Close()
				}
			}()
			await(t, events, "load_start a")
			cancelLoad()
			<-loadDone

			f.FailIndex(failed)
			done := make(chan error, 1)
			go func() { done <- b.WaitStarted(t.Context()) }()
			// The load is let finish only once WaitStarted has read the index and seen
			// it LOADING; a WaitStarted that returns before then did not wait for it.
			var err error
			for reads := 0; reads <= failed; {
				select {
				case <-indexRead:
					reads++
				case err = <-done:
					t.Fatalf("WaitStarted = %v after %d index reads, while a is still LOADING", err, reads)
				case <-time.After(waitLimit):
					t.Fatal("WaitStarted neither returned nor read the index")
				}
			}
			release()
			if err = errorOf(t, done); err != nil {
				t.Fatal(err)
			}
			inv, err := b.Inventory(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(inv.Loaded, []string{"a"}) {
				t.Fatalf("Inventory.Loaded = %q, want a: the load under way at start holds room", inv.Loaded)
			}
		})
	}
}

// WaitStarted gives up, saying why, when the index stays unreadable for StartTimeout:
// it cannot tell whether a load is under way.
func TestWaitStartedGivesUpOnAnIndexItCannotRead(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"a"}}, func(c *triton.Config) { c.StartTimeout = 50 * time.Millisecond })
	x.fake.FailIndex(1 << 30)
	err := x.b.WaitStarted(t.Context())
	if err == nil || !strings.Contains(err.Error(), "repository index not readable within 50ms") || !strings.Contains(err.Error(), "failed to poll the model repository") {
		t.Fatalf("WaitStarted = %v, want it to give up naming the index and Triton's message", err)
	}
}

// A load reads the index first and an unload reads it until the model has left
// UNLOADING; one failed read (Triton's 500 when its repository volume hiccups) is read
// again. It failed the load, reported as the label's LOAD_FAILED, and the unload.
func TestIndexHiccupFailsNeitherLoadNorUnload(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"m"}}, nil)
	x.fake.FailIndex(1)
	if err := x.b.Load(t.Context(), "m"); err != nil {
		t.Fatalf("Load after one failed index read = %v", err)
	}
	if n := x.fake.LoadRequests("m"); n != 1 {
		t.Fatalf("%d load requests, want 1", n)
	}
	x.fake.FailIndex(2)
	if err := x.b.Unload(t.Context(), "m"); err != nil {
		t.Fatalf("Unload after two failed index reads = %v", err)
	}
	if st := x.fake.State("m"); st != fake.StateUnavailable {
		t.Fatalf("m is %q after Unload, want UNAVAILABLE", st)
	}
}

// An index that stays unreadable fails the load, unsent, as the backend being
// unavailable (backend.ErrUnavailable): the agent then refuses the task and does not
// report the label's LOAD_FAILED, which would count towards marking a model that never
// got a chance failing on every worker.
func TestUnreadableIndexFailsTheLoadAsUnavailable(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"m"}}, nil)
	x.fake.FailIndex(1 << 30)
	err := x.b.Load(t.Context(), "m")
	if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "failed to poll the model repository") {
		t.Fatalf("Load = %v, want backend.ErrUnavailable carrying Triton's message", err)
	}
	if n := x.fake.LoadRequests("m"); n != 0 {
		t.Fatalf("%d load requests, want none", n)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		cfg   triton.Config
	}{
		{"URL", triton.Config{URL: "ws://x"}},
		{"URL", triton.Config{URL: "http://"}},
		{"LoadTimeout", triton.Config{LoadTimeout: -time.Second}},
		{"UnloadTimeout", triton.Config{UnloadTimeout: -time.Second}},
		{"MaxIdleConns", triton.Config{MaxIdleConns: -1}},
	} {
		if _, err := triton.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
	c := triton.Config{}.WithDefaults()
	if c.URL != "http://127.0.0.1:8000" || c.LoadTimeout != 10*time.Minute || c.TextInput != "TEXT" || c.EmbeddingOutput != "sentence_embedding" || c.MaxIdleConns != 16 {
		t.Errorf("defaults %+v", c)
	}
}

// params is an infer request the fake answers.
var params = []byte(`{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}`)

// lostModel returns a backend that loaded model m, which Triton then lost: someone
// unloaded it behind the backend's back, or Triton restarted empty. The events are
// the fake's from the loss on.
func lostModel(t *testing.T) (*bundle, <-chan string) {
	t.Helper()
	x := setup(t, fake.Config{Models: []string{"m"}}, nil)
	if err := x.b.Load(t.Context(), "m"); err != nil {
		t.Fatal(err)
	}
	return x, unloadBehindTheBackend(t, x)
}

// unloadBehindTheBackend unloads m at the fake directly, as a Triton restart would lose
// it, and returns the fake's events from then on.
func unloadBehindTheBackend(t *testing.T, x *bundle) <-chan string {
	t.Helper()
	events := x.fake.Subscribe()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, x.srv.URL+"/v2/repository/models/m/unload", nil)
	// The server's own client: another test's httptest Close closes the default
	// transport's idle connections, and a POST that had just taken one fails.
	resp, err := x.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	await(t, events, "unloaded m")
	return events
}

func TestRunReloadsAModelTritonLost(t *testing.T) {
	t.Parallel()
	x, _ := lostModel(t)
	if _, err := x.b.Run(t.Context(), backend.Task{Type: triton.TaskInfer, Label: "m", Params: params}); err != nil {
		t.Fatalf("Run after Triton lost the model = %v, want it loaded again", err)
	}
	if n := x.fake.Loads("m"); n != 2 {
		t.Fatalf("m loaded %d times, want 2", n)
	}
	// A model this backend never loaded is not loaded behind the agent's back.
	if _, err := x.b.Run(t.Context(), backend.Task{Type: triton.TaskInfer, Label: "other", Params: params}); err == nil {
		t.Fatal("Run on a model never loaded succeeded")
	}
}

// OnError hears only Ops (the agent makes a metric series for each up front), and only
// failures. The readiness check an infer makes after Triton's 404 reported op "ready",
// which has no series, and counted the answer it asks for as a failure.
func TestOnErrorHearsFailedCallsOfOps(t *testing.T) {
	t.Parallel()
	var (
		mu        sync.Mutex
		ops       []string
		readyFail atomic.Bool
	)
	x := serve(t, fake.New(fake.Config{Models: []string{"m"}}), func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if readyFail.Load() && strings.HasSuffix(r.URL.Path, "/ready") {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			next.ServeHTTP(w, r)
		})
	}, func(c *triton.Config) {
		c.OnError = func(op string) { mu.Lock(); ops = append(ops, op); mu.Unlock() }
	})
	heard := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(ops)
	}
	if err := x.b.Load(t.Context(), "m"); err != nil {
		t.Fatal(err)
	}
	// Triton lost m: the infer's 404 is a failure, the readiness check's 404 is not.
	unloadBehindTheBackend(t, x)
	if _, err := x.b.Run(t.Context(), backend.Task{Type: triton.TaskInfer, Label: "m", Params: params}); err != nil {
		t.Fatal(err)
	}
	if got := heard(); !slices.Equal(got, []string{triton.OpInfer}) {
		t.Fatalf("OnError heard %q, want only infer's failure", got)
	}
	// A readiness check answered 500 did fail, and counts under an Op of Ops.
	readyFail.Store(true)
	unloadBehindTheBackend(t, x)
	if _, err := x.b.Run(t.Context(), backend.Task{Type: triton.TaskInfer, Label: "m", Params: params}); err != nil {
		t.Fatal(err)
	}
	got := heard()
	if !slices.Equal(got, []string{triton.OpInfer, triton.OpInfer, triton.OpReady}) {
		t.Fatalf("OnError heard %q, want infer, infer, ready", got)
	}
	for _, op := range got {
		if !slices.Contains(triton.Ops(), op) {
			t.Fatalf("OnError(%q), which Ops() %q lacks", op, triton.Ops())
		}
	}
}

// The load that brings back a model Triton lost goes on when the task that started
// it gives up. Cancelled with it (and unloaded again), it never finished while every
// task on the label had a deadline shorter than the load: the label stayed held in
// the agent's books and each of its tasks failed there.
func TestReloadOutlivesTheTaskThatStartedIt(t *testing.T) {
	t.Parallel()
	x, events := lostModel(t)
	release := x.fake.HoldLoads("m")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := x.b.Run(ctx, backend.Task{Type: triton.TaskInfer, Label: "m", Params: params})
		done <- err
	}()
	await(t, events, "load_start m")
	cancel() // the task's deadline passed
	if err := errorOf(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	release()
	// Once any load of m under way has ended, m is loaded and was loaded once more,
	// not loaded, unloaded and loaded again.
	if err := x.b.Load(t.Context(), "m"); err != nil {
		t.Fatal(err)
	}
	if n := x.fake.Loads("m"); n != 2 {
		t.Errorf("m loaded %d times, want 2 (the reload was abandoned with its task)", n)
	}
	if _, err := x.b.Run(t.Context(), backend.Task{Type: triton.TaskInfer, Label: "m", Params: params}); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// A load that outlives LoadTimeout is abandoned and unloaded; Triton runs that unload
// only once the load ends, so the model can still be LOADING (holding memory) when the
// unload's own timeout passes. The next load of another model waits for it (TRITON.md:
// loading before memory is released has crashed servers), and goes ahead once it is
// gone. Before, it went in beside the abandoned one: one model more than counted.
func TestAbandonedLoadStillLoadingKeepsItsRoom(t *testing.T) {
	t.Parallel()
	x := setup(t, fake.Config{Models: []string{"big", "small"}}, func(c *triton.Config) {
		// Long enough for the load to reach Triton on a loaded machine; the unload's
		// timeout short, as the defect needs.
		c.LoadTimeout = 2 * time.Second
		c.UnloadTimeout = 200 * time.Millisecond
	})
	release := x.fake.HoldLoads("big")
	if err := x.b.Load(t.Context(), "big"); err == nil {
		t.Fatal("Load of big succeeded while Triton still loads it")
	}
	if st := x.fake.State("big"); st != fake.StateLoading {
		t.Fatalf("big is %q, want still LOADING", st)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	err := x.b.Load(ctx, "small")
	cancel()
	if err == nil || slices.Contains(x.fake.Events(), "load_start small") {
		t.Fatalf("Load(small) = %v, events %v: sent while big, abandoned, was still LOADING", err, x.fake.Events())
	}
	release() // big's load ends; Triton then runs the unload it queued
	if err := x.b.Load(t.Context(), "small"); err != nil {
		t.Fatalf("Load(small) once big is gone: %v", err)
	}
	if st := x.fake.State("big"); st == fake.StateReady || st == fake.StateLoading || st == fake.StateUnloading {
		t.Fatalf("big is %q after small loaded, want it gone", st)
	}
}

// A Triton restarted in explicit mode with the refused model preloaded: once the
// inventory counts the model as loaded, Health must not ask again with an unload of it,
// which would drop a model the dispatcher routes here (a label miss nobody counted).
func TestHealthDoesNotUnloadAModelItHolds(t *testing.T) {
	x := setup(t, fake.Config{Models: []string{"a"}, NotExplicit: true}, nil)
	if err := x.b.WaitStarted(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := x.b.Load(t.Context(), "a"); err == nil {
		t.Fatal("load in not-explicit mode succeeded")
	}
	x.fake.SetNotExplicit(false)
	resp, err := http.Post(x.srv.URL+"/v2/repository/models/a/load", "application/json", nil) // --load-model=a at restart
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	inv, err := x.b.Inventory(t.Context())
	if err != nil || !slices.Contains(inv.Loaded, "a") {
		t.Fatalf("Inventory = %+v, %v; want a loaded", inv, err)
	}
	if err := x.b.Health(t.Context()); err != nil {
		t.Fatalf("Health = %v", err)
	}
	if st := x.fake.State("a"); st != fake.StateReady {
		t.Fatalf("after Health, model a (held: Inventory said loaded) is %q, want READY", st)
	}
}
