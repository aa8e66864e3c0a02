package fake_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/smartroute/smartroute/worker-agent/backend/triton/fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type client struct {
	t    *testing.T
	url  string
	http *http.Client // the server's own: another test's httptest Close closes the default transport's idle connections, failing a POST that had taken one
}

func serve(t *testing.T, f *fake.Server) *client {
	srv := httptest.NewServer(f)
	t.Cleanup(func() { f.Close(); srv.Close() })
	return &client{t: t, url: srv.URL, http: srv.Client()}
}

// do sends a request and returns the status and body.
func (c *client) do(method, path, body string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequestWithContext(c.t.Context(), method, c.url+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (c *client) expect(method, path, body string, code int, contains string) {
	c.t.Helper()
	got, text := c.do(method, path, body)
	if got != code || !strings.Contains(text, contains) {
		c.t.Errorf("%s %s = %d %q, want %d containing %q", method, path, got, text, code, contains)
	}
}

func await(t *testing.T, events <-chan string, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
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

func TestFollowsTritonFacts(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"b", "a", "c"}, Preload: []string{"b"}})
	c := serve(t, f)
	c.expect("GET", "/v2", "", 200, `"model_repository"`)
	c.expect("GET", "/v2/health/live", "", 200, "")
	c.expect("GET", "/v2/health/ready", "", 200, "")
	// A never-loaded model has only its name; the array is top-level and sorted.
	c.expect("POST", "/v2/repository/index", "{}", 200, `[{"name":"a"},{"name":"b","version":"1","state":"READY"},{"name":"c"}]`)
	c.expect("POST", "/v2/repository/index", `{"ready": true}`, 200, `[{"name":"b","version":"1","state":"READY"}]`)
	c.expect("POST", "/v2/repository/index", `{`, 400, `"error"`)
	c.expect("GET", "/v2/models/b/ready", "", 200, "")
	c.expect("GET", "/v2/models/b/versions/1/ready", "", 200, "")
	c.expect("GET", "/v2/models/a/ready", "", 404, "")
	c.expect("GET", "/v2/models/nope/ready", "", 404, "")
	c.expect("GET", "/v2/models/a/stats", "", 400, `{"error":"requested model 'a' is not available"}`)
	c.expect("GET", "/v2/models/b/stats", "", 200, `"inference_count":0`)

	// Loading blocks; while it does, the model is LOADING, known-not-ready, and the
	// server is not ready.
	events := f.Subscribe()
	release := f.HoldLoads("a")
	loaded := make(chan int, 1)
	go func() { code, _ := c.do("POST", "/v2/repository/models/a/load", ""); loaded <- code }()
	await(t, events, "load_start a")
	c.expect("GET", "/v2/models/a/ready", "", 400, "")
	c.expect("GET", "/v2/health/ready", "", 400, "")
	c.expect("GET", "/v2/health/live", "", 200, "")
	c.expect("POST", "/v2/repository/index", "{}", 200, `{"name":"a","version":"1","state":"LOADING"}`)
	release()
	if code := <-loaded; code != 200 {
		t.Fatalf("load = %d", code)
	}
	c.expect("POST", "/v2/repository/models/a/load", "", 200, "") // no-op
	if n := f.Loads("a"); n != 1 {
		t.Errorf("a loaded %d times", n)
	}

	// Infer: BYTES in, FP32 out with a shape.
	c.expect("POST", "/v2/models/a/infer", `{"id":"r1","inputs":[{"name":"TEXT","shape":[2,1],"datatype":"BYTES","data":["x","y"]}]}`,
		200, `"outputs":[{"name":"sentence_embedding","datatype":"FP32","shape":[2,8],"data":[`)
	c.expect("POST", "/v2/models/a/infer", `{"inputs":[{"name":"TEXT","shape":[3],"datatype":"BYTES","data":["x"]}]}`, 400, "unexpected number of elements")
	c.expect("POST", "/v2/models/a/infer", `{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}],"parameters":{"binary_data_output":true}}`, 400, "binary")
	c.expect("GET", "/v2/models/a/stats", "", 200, `"inference_count":2`)

	// Unload answers at once; the model stays UNLOADING until released.
	hold := f.HoldUnloads("a")
	c.expect("POST", "/v2/repository/models/a/unload", "", 200, "")
	c.expect("POST", "/v2/repository/index", "{}", 200, `{"name":"a","version":"1","state":"UNLOADING"}`)
	c.expect("GET", "/v2/health/ready", "", 400, "")
	c.expect("POST", "/v2/models/a/infer", `{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}`, 503, `"error"`)
	hold()
	await(t, events, "unloaded a")
	c.expect("POST", "/v2/repository/index", "{}", 200, `{"name":"a","version":"1","state":"UNAVAILABLE","reason":"unloaded"}`)
	c.expect("GET", "/v2/models/a/ready", "", 404, "")
	c.expect("POST", "/v2/models/a/infer", `{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}`, 404, "Request for unknown model: 'a' is not found")
	c.expect("POST", "/v2/repository/models/c/unload", "", 200, "") // not loaded: still 200

	// Load failures.
	f.FailLoads("c", "bad onnx")
	c.expect("POST", "/v2/repository/models/c/load", "", 400, "load failed for model 'c'")
	c.expect("POST", "/v2/repository/index", "{}", 200, `"state":"UNAVAILABLE","reason":"load failed for model 'c'`)
	c.expect("GET", "/v2/models/c/ready", "", 400, "")
	c.expect("POST", "/v2/repository/models/zz/load", "", 500, "failed to poll from model repository")
	c.expect("GET", "/v2/nothing", "", 404, `{"error":`)

	// Old servers answer 400 for every error.
	f.SetOldErrors(true)
	c.expect("POST", "/v2/repository/models/zz/load", "", 400, "failed to poll from model repository")
	c.expect("GET", "/v2/models/a/ready", "", 400, "")
	c.expect("POST", "/v2/models/a/infer", `{"inputs":[]}`, 400, "unknown model")

	// Not live; then gone altogether.
	f.SetLive(false)
	c.expect("GET", "/v2/health/live", "", 400, "")
	f.SetLive(true)
	f.SetDown(true)
	req, _ := http.NewRequestWithContext(context.Background(), "GET", c.url+"/v2/health/live", nil)
	if resp, err := c.http.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("a down server answered %d", resp.StatusCode)
	}
	f.SetDown(false)
	c.expect("GET", "/v2/health/live", "", 200, "")
}

func TestUnloadWaitsForInFlightRequestsAndDelays(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a"}, Preload: []string{"a"}, UnloadDelay: time.Millisecond})
	c := serve(t, f)
	events := f.Subscribe()
	c.expect("POST", "/v2/repository/models/a/unload", "", 200, "")
	await(t, events, "unloaded a")
	if got := f.State("a"); got != fake.StateUnavailable {
		t.Fatalf("state %q", got)
	}
}

// A load of a model that is still UNLOADING waits for the unload to end, and is
// recorded all the same: Triton is not known to wait (a load before the unload has
// freed memory has crashed servers), so a client that sends one must fail its tests.
// It was recorded only while another model was unloading.
func TestLoadDuringItsOwnUnloadIsRecorded(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a"}, Preload: []string{"a"}})
	c := serve(t, f)
	events := f.Subscribe()
	release := f.HoldUnloads("a")
	defer release()
	c.expect("POST", "/v2/repository/models/a/unload", "", 200, "")
	if st := f.State("a"); st != fake.StateUnloading {
		t.Fatalf("state %q after the unload, want UNLOADING", st)
	}
	loaded := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", c.url+"/v2/repository/models/a/load", nil)
		resp, err := c.http.Do(req)
		if err != nil {
			loaded <- 0
			return
		}
		resp.Body.Close()
		loaded <- resp.StatusCode
	}()
	await(t, events, "load_requested a")
	if w := f.LoadsWhileUnloading(); !slices.Equal(w, []string{"a while a UNLOADING"}) {
		t.Errorf("LoadsWhileUnloading = %q, want the load of a while a was UNLOADING", w)
	}
	release()
	if code := <-loaded; code != 200 {
		t.Fatalf("load = %d, want 200 once the unload ended", code)
	}
	evs := f.Events()
	if i, j := slices.Index(evs, "unloaded a"), slices.Index(evs, "load_start a"); i < 0 || j < i {
		t.Fatalf("events %q: the load started before the unload ended", evs)
	}
}

func TestNotExplicitAndDoubleLoads(t *testing.T) {
	t.Parallel()
	f := fake.New(fake.Config{Models: []string{"a"}, NotExplicit: true})
	c := serve(t, f)
	c.expect("POST", "/v2/repository/models/a/load", "", 503, "explicit model load / unload is not allowed")
	c.expect("POST", "/v2/repository/models/a/unload", "", 503, "explicit model load / unload is not allowed")

	g := fake.New(fake.Config{Models: []string{"a"}})
	d := serve(t, g)
	events := g.Subscribe()
	release := g.HoldLoads("a")
	codes := make(chan int, 2)
	for range 2 {
		go func() { code, _ := d.do("POST", "/v2/repository/models/a/load", ""); codes <- code }()
		await(t, events, "load_start a")
	}
	release()
	for range 2 {
		if code := <-codes; code != 200 {
			t.Fatalf("load = %d", code)
		}
	}
	if g.MaxConcurrentLoads("a") != 2 || g.Loads("a") != 2 {
		t.Fatalf("concurrent loads %d, loads %d; want the double load recorded", g.MaxConcurrentLoads("a"), g.Loads("a"))
	}
	var idx []map[string]string
	_, body := d.do("POST", "/v2/repository/index", "")
	if err := json.Unmarshal([]byte(body), &idx); err != nil || len(idx) != 1 || idx[0]["state"] != "READY" {
		t.Fatalf("index %s (%v)", body, err)
	}
}

// With a repository folder, a model folder added while the server runs joins the index
// and loads; one removed leaves it (unless loaded, as in Triton) and no longer loads.
func TestRepositoryDirIsReadAtEveryIndexAndLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := serve(t, fake.New(fake.Config{Models: []string{"a"}, RepositoryDir: dir}))
	c.expect("POST", "/v2/repository/index", "", 200, `[{"name":"a"}]`)
	for _, m := range []string{"b", "c"} {
		if err := os.Mkdir(filepath.Join(dir, m), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "README"), nil, 0o644); err != nil { // not a model
		t.Fatal(err)
	}
	c.expect("POST", "/v2/repository/index", "", 200, `[{"name":"a"},{"name":"b"},{"name":"c"}]`)
	c.expect("POST", "/v2/repository/models/b/load", "", 200, "")
	for _, m := range []string{"b", "c"} {
		if err := os.Remove(filepath.Join(dir, m)); err != nil {
			t.Fatal(err)
		}
	}
	c.expect("POST", "/v2/repository/models/c/load", "", 500, "failed to poll from model repository")
	c.expect("POST", "/v2/repository/index", "", 200, `[{"name":"a"},{"name":"b","version":"1","state":"READY"}]`)
}
