package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/goleak"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// golang-lru v2.0.7's expirable cache starts a janitor goroutine that cannot be
// stopped (upstream defers a Close to a later major version): one per dispatcher.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"))
}

type bundle struct {
	t   *testing.T
	d   *Dispatcher
	srv *httptest.Server
	// workerToken and apiKey, when set, are sent by dial and get.
	workerToken, apiKey string
}

func setup(t *testing.T, cfg Config) *bundle {
	t.Helper()
	return setupListener(t, cfg, nil)
}

// setupListener is setup with the server's listener wrapped by wrap (when not nil).
func setupListener(t *testing.T, cfg Config, wrap func(net.Listener) net.Listener) *bundle {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(d.Handler())
	if wrap != nil {
		srv.Listener = wrap(srv.Listener)
	}
	srv.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.RunBackground(ctx); close(done) }()
	t.Cleanup(func() {
		d.hub.beginShutdown()
		for _, wc := range d.hub.closeWorkers(&Disconnect{Code: pb.CloseCode_CLOSE_CODE_SHUTDOWN, Reason: "test over"}) {
			<-wc.done()
		}
		srv.CloseClientConnections()
		srv.Close()
		cancel()
		<-done
	})
	return &bundle{t: t, d: d, srv: srv}
}

// registered is the hub's connection for worker id, read under the hub's lock.
func (b *bundle) registered(id string) *workerConn {
	b.t.Helper()
	b.d.hub.mu.Lock()
	defer b.d.hub.mu.Unlock()
	wc := b.d.hub.workers[id]
	if wc == nil {
		b.t.Fatalf("worker %q is not registered", id)
	}
	return wc
}

// client sends the tests' requests: the server's own client, or, for a dispatcher run
// outside httptest, one without keep-alive. Not the default client: httptest's Close
// of another test's server closes its idle connections, and a POST that had just taken
// one fails (it is not retried, as a GET is).
func (b *bundle) client() *http.Client {
	if c := b.srv.Client(); c != nil {
		return c
	}
	return noKeepAlive
}

var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

func (b *bundle) wsURL() string {
	return "ws" + strings.TrimPrefix(b.srv.URL, "http") + "/worker-listen"
}

func (b *bundle) post(path, body string) (int, map[string]any) {
	b.t.Helper()
	resp, err := b.client().Post(b.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		b.t.Fatalf("answer to %s is not JSON: %q", path, raw)
	}
	return resp.StatusCode, out
}

func (b *bundle) get(path string) (int, map[string]any) {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, b.srv.URL+path, nil)
	if b.apiKey != "" {
		req.Header.Set("X-API-Key", b.apiKey)
	}
	resp, err := b.client().Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// fakeWorker is a scripted worker on a real WebSocket.
type fakeWorker struct {
	t  *testing.T
	id string
	ws *websocket.Conn
	mu sync.Mutex
}

func (b *bundle) dial(id string, labels ...string) *fakeWorker {
	b.t.Helper()
	return b.dialHello(&pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: id, MaxLabels: 2, Slots: 1, HeldLabels: labels})
}

// dialHello connects a worker that introduces itself with hello.
func (b *bundle) dialHello(hello *pb.Hello) *fakeWorker {
	b.t.Helper()
	w := b.dialRaw(hello.WorkerId)
	w.write(&pb.Envelope{Body: &pb.Envelope_Hello{Hello: hello}})
	if env := w.read(); env.GetWelcome() == nil {
		b.t.Fatalf("want a welcome, got %v", env)
	}
	// addWorker queues the Welcome under the hub's lock as it registers the worker, and
	// /workers takes that lock: a welcomed worker is listed already.
	if ids := b.workers(); !contains(ids, hello.WorkerId) {
		b.t.Fatalf("worker %s was welcomed but /workers lists %q", hello.WorkerId, ids)
	}
	return w
}

// answered waits until task id has its answer: its record's done channel closes.
func (b *bundle) answered(id string) {
	b.t.Helper()
	b.d.hub.mu.Lock()
	rec := b.d.hub.knownLocked(id)
	b.d.hub.mu.Unlock()
	if rec == nil {
		b.t.Fatalf("task %s is unknown", id)
	}
	select {
	case <-rec.done:
	case <-time.After(10 * time.Second): // a failure bound, not synchronisation
		b.t.Fatalf("task %s not answered within 10 s", id)
	}
}

// awaitGone waits until the dispatcher's reader of connection wc has ended, and
// checks that /workers no longer lists the worker: the reader takes the worker out of
// the hub before it ends. Take wc (b.registered) before the connection is ended.
func (b *bundle) awaitGone(wc *workerConn) {
	b.t.Helper()
	select {
	case <-wc.read:
	case <-time.After(10 * time.Second): // a failure bound, not synchronisation
		b.t.Fatalf("worker %s still connected after 10 s", wc.id)
	}
	if ids := b.workers(); contains(ids, wc.id) {
		b.t.Fatalf("worker %s's connection ended, yet /workers lists %q", wc.id, ids)
	}
}

func (b *bundle) dialRaw(id string) *fakeWorker {
	b.t.Helper()
	h := http.Header{}
	h.Set("Worker-Id", id)
	if b.workerToken != "" {
		h.Set("Authorization", "Bearer "+b.workerToken)
	}
	ws, _, err := websocket.DefaultDialer.Dial(b.wsURL(), h)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { ws.Close() })
	return &fakeWorker{t: b.t, id: id, ws: ws}
}

func (b *bundle) workers() []string {
	_, out := b.get("/workers")
	var ids []string
	for _, v := range out["workers"].([]any) {
		ids = append(ids, v.(string))
	}
	return ids
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func (w *fakeWorker) write(env *pb.Envelope) {
	w.t.Helper()
	b, err := frame.Encode(nil, env)
	if err != nil {
		w.t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.ws.WriteMessage(websocket.BinaryMessage, b); err != nil {
		w.t.Fatal(err)
	}
}

func (w *fakeWorker) read() *pb.Envelope {
	w.t.Helper()
	w.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, b, err := w.ws.ReadMessage()
	if err != nil {
		w.t.Fatalf("worker %s read: %v", w.id, err)
	}
	env, err := frame.Decode(b, 0)
	if err != nil {
		w.t.Fatal(err)
	}
	return env
}

// closeCode reads until the dispatcher closes the connection and returns its code.
func (w *fakeWorker) closeCode() (int, string) {
	w.t.Helper()
	w.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, _, err := w.ws.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Code, ce.Text
		}
		w.t.Fatalf("want a close frame, got %v", err)
	}
}

func (w *fakeWorker) assignment() *pb.TaskAssignment {
	w.t.Helper()
	env := w.read()
	a := env.GetAssignment()
	if a == nil {
		w.t.Fatalf("want an assignment, got %v", env)
	}
	return a
}

func (w *fakeWorker) finish(a *pb.TaskAssignment, ok bool, result string) {
	w.write(&pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
		TaskId: a.TaskId, Attempt: a.Attempt, Ok: ok, Result: []byte(result), Error: map[bool]string{false: "boom"}[ok],
		LabelMiss: a.EvictLabel != "", RunDurationUs: 1000}}})
}

type answer struct {
	status int
	body   map[string]any
	header http.Header
}

// postAsync posts in the background and delivers the answer on the returned channel.
func (b *bundle) postAsync(body string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		resp, err := b.client().Post(b.srv.URL+"/run-task", "application/json", strings.NewReader(body))
		if err != nil {
			ch <- answer{status: -1}
			return
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		ch <- answer{resp.StatusCode, out, resp.Header}
	}()
	return ch
}

func TestRunTaskRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w := b.dial("w1", "m")
	ans := b.postAsync(`{"task_id":"t1","task_type":"embed","label":"m","parameters_json":"{\"x\":1}"}`)
	a := w.assignment()
	if a.TaskId != "t1" || a.Label != "m" || a.Attempt != 1 || string(a.ParametersJson) != `{"x":1}` || a.DeadlineUnixMs == 0 {
		t.Fatalf("assignment %v", a)
	}
	w.finish(a, true, `{"y":2}`)
	got := <-ans
	if got.status != 200 || got.body["status"] != "completed" || got.body["worker_id"] != "w1" {
		t.Fatalf("answer %d %v", got.status, got.body)
	}
	if r := got.body["result"].(map[string]any); r["y"] != float64(2) {
		t.Fatalf("result %v", got.body["result"])
	}
	// The task stays visible, and resubmitting its id returns the stored answer.
	if code, v := b.get("/tasks/t1"); code != 200 || v["status"] != "completed" {
		t.Fatalf("GET /tasks/t1: %d %v", code, v)
	}
	code, v := b.post("/run-task", `{"task_id":"t1","task_type":"embed","label":"m","parameters_json":"{\"x\":1}"}`)
	if code != 200 || v["status"] != "completed" {
		t.Fatalf("resubmission: %d %v", code, v)
	}
	if code, _ := b.get("/tasks/nope"); code != 404 {
		t.Fatalf("unknown task: %d", code)
	}
}

func TestAsyncSubmitThenGet(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	code, v := b.post("/run-task", `{"task_id":"a1","task_type":"x","label":"m","return_result":false}`)
	if code != 202 || v["task_id"] != "a1" {
		t.Fatalf("async submit: %d %v", code, v)
	}
	if _, v := b.get("/tasks/a1"); v["status"] != "queued" {
		t.Fatalf("before a worker: %v", v)
	}
	w := b.dial("w1")
	a := w.assignment()
	if _, v := b.get("/tasks/a1"); v["status"] != "running" {
		t.Fatalf("while running: %v", v)
	}
	w.finish(a, false, "")
	b.answered("a1") // the failure is final once the worker reported it
	if _, v := b.get("/tasks/a1"); v["status"] != "failed" || !strings.Contains(v["error"].(string), "boom") {
		t.Fatalf("after the worker's failure: %v", v)
	}
}

// A task submitted without task_id gets an id no producer can guess. They were a
// counter after a prefix that every answer showed: a producer that submitted the next
// one first was handed another producer's task as a resubmission of its own.
func TestGeneratedTaskIDsCannotBeGuessed(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	seen := map[string]bool{}
	var last string
	for range 50 {
		code, out := b.post("/run-task", `{"task_type":"x","label":"m","return_result":false}`)
		id, _ := out["task_id"].(string)
		if code != 202 || len(id) < 26 || seen[id] {
			t.Fatalf("submit without task_id: %d %v (ids so far %d)", code, out, len(seen))
		}
		seen[id] = true
		last = id
	}
	// The old scheme's next id, submitted first by another producer, is its own task.
	guess := last[:len(last)-1] + string(last[len(last)-1]+1)
	b.post("/run-task", `{"task_id":"`+guess+`","task_type":"x","label":"m","return_result":false}`)
	if _, out := b.post("/run-task", `{"task_type":"x","label":"m","return_result":false}`); out["task_id"] == guess || seen[out["task_id"].(string)] {
		t.Fatalf("a submission without task_id got an existing task: %v", out)
	}
}

func TestDeadlineGives504(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	code, v := b.post("/run-task", `{"task_type":"x","label":"m","timeout_ms":50}`)
	if code != 504 || !strings.Contains(v["error"].(string), "deadline") {
		t.Fatalf("want 504, got %d %v", code, v)
	}
}

func TestAffinityAndRandomRouting(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w1 := b.dial("w1", "a")
	w2 := b.dial("w2", "b")
	for i := 0; i < 3; i++ {
		ans := b.postAsync(`{"task_type":"x","label":"b"}`)
		a := w2.assignment()
		w2.finish(a, true, "{}")
		if got := <-ans; got.body["worker_id"] != "w2" || got.body["label_miss"] != false {
			t.Fatalf("round %d: %v", i, got.body)
		}
	}
	_ = w1
	_, labels := b.get("/labels")
	if len(labels["a"].([]any)) != 1 || labels["b"].([]any)[0] != "w2" {
		t.Fatalf("/labels %v", labels)
	}
	code, det := b.get("/workers?detail=true")
	if code != 200 || len(det["workers"].([]any)) != 2 {
		t.Fatalf("/workers?detail=true: %d %v", code, det)
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxBodyBytes: 256})
	cases := []struct {
		name, body string
		status     int
		want       string
	}{
		{"malformed", `{"label":`, 400, "not a valid task"},
		{"missing label", `{"task_type":"x"}`, 400, "label is required"},
		{"unknown field", `{"task_type":"x","label":"m","colour":"red"}`, 400, "unknown field"},
		{"trailing data", `{"task_type":"x","label":"m"} {}`, 400, "after the task"},
		{"bad params", `{"task_type":"x","label":"m","parameters_json":"{oops"}`, 400, "parameters_json"},
		{"label with space", `{"task_type":"x","label":"a b"}`, 400, "printable"},
		{"oversized", `{"task_type":"x","label":"` + strings.Repeat("m", 300) + `"}`, 413, "larger than"},
		{"bad timeout", `{"task_type":"x","label":"m","timeout_ms":-1}`, 400, "timeout_ms"},
	}
	for _, c := range cases {
		code, v := b.post("/run-task", c.body)
		if code != c.status || !strings.Contains(v["error"].(string), c.want) {
			t.Errorf("%s: got %d %v, want %d containing %q", c.name, code, v, c.status, c.want)
		}
	}
	if q := b.d.hub.sched.QueuedTasks(); q != 0 {
		t.Fatalf("bad requests queued %d tasks", q)
	}
	if code, v := b.get("/workers?detail=maybe"); code != 400 {
		t.Fatalf("bad detail flag: %d %v", code, v)
	}
	if code, v := b.post("/upload-model", `{"model_id":"x"}`); code != 503 || !strings.Contains(v["error"].(string), "uploader") {
		t.Fatalf("upload without uploader: %d %v", code, v)
	}
}

func TestUploadModelForwarded(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/upload-model" || !bytes.Contains(body, []byte("mini")) {
			http.Error(w, "unexpected", 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if bytes.Contains(body, []byte("chatty")) { // an answer over 1 MiB
			w.Write([]byte(`{"status":"success","log":"` + strings.Repeat("x", 1<<20) + `"}`))
			return
		}
		w.Write([]byte(`{"status":"success"}`))
	}))
	defer up.Close()
	b := setup(t, Config{UploaderURL: up.URL})
	if code, v := b.post("/upload-model", `{"model_id":"mini"}`); code != 200 || v["status"] != "success" {
		t.Fatalf("forwarded upload: %d %v", code, v)
	}
	// Passed on cut at 1 MiB, it would be a 200 with broken JSON.
	if code, v := b.post("/upload-model", `{"model_id":"mini-chatty"}`); code != 502 || !strings.Contains(v["error"].(string), "larger than") {
		t.Fatalf("an uploader answer over the bound: %d %v", code, v)
	}
	// A base URL written with a trailing slash forwards to the same path, not to
	// //upload-model, which a strict router answers 404.
	b = setup(t, Config{UploaderURL: up.URL + "/"})
	if code, v := b.post("/upload-model", `{"model_id":"mini"}`); code != 200 || v["status"] != "success" {
		t.Fatalf("forwarded upload with --uploader-url ending in /: %d %v", code, v)
	}
}

// What a worker announces is bounded (frame.CheckHello, CheckLabels): a hello whose
// lists run to tens of thousands of labels had held the routing lock for seconds, and a
// label no task could name is no label. Each is refused with BAD_FRAME and the reason.
func TestWorkerAnnouncementsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	long := strings.Repeat("x", frame.MaxLabelBytes+1)
	w := b.dialRaw("huge")
	w.write(&pb.Envelope{Body: &pb.Envelope_Hello{Hello: &pb.Hello{ProtocolVersion: frame.ProtocolVersion,
		WorkerId: "huge", MaxLabels: frame.MaxCapacity + 1, Slots: 1}}})
	if code, text := w.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_BAD_FRAME) || !strings.Contains(text, "max_labels") {
		t.Errorf("hello with max_labels over the bound: close %d %q", code, text)
	}
	w = b.dial("event")
	w.write(&pb.Envelope{Body: &pb.Envelope_LabelEvent{LabelEvent: &pb.LabelEvent{Kind: pb.LabelEvent_KIND_LOADED, Label: long}}})
	if code, text := w.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_BAD_FRAME) || !strings.Contains(text, "label") {
		t.Errorf("label event with a %d-byte label: close %d %q", len(long), code, text)
	}
	w = b.dial("inventory")
	w.write(&pb.Envelope{Body: &pb.Envelope_Inventory{Inventory: &pb.Inventory{LoadableLabels: []string{"a", ""}}}})
	if code, text := w.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_BAD_FRAME) || !strings.Contains(text, "loadable_labels[1]") {
		t.Errorf("inventory with an empty label: close %d %q", code, text)
	}
	if _, labels := b.get("/labels"); len(labels) != 0 {
		t.Errorf("/labels %v after refused announcements, want none", labels)
	}
}

func TestWorkerListenRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	// No Worker-Id: 400 before any upgrade.
	_, resp, err := websocket.DefaultDialer.Dial(b.wsURL(), nil)
	if err == nil || resp == nil || resp.StatusCode != 400 {
		t.Fatalf("missing Worker-Id: err %v resp %v", err, resp)
	}
	// A garbage first frame: closed with BAD_FRAME.
	w := b.dialRaw("garbage")
	w.ws.WriteMessage(websocket.BinaryMessage, []byte{0xff, 0x01, 0x02})
	if code, _ := w.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_BAD_FRAME) {
		t.Fatalf("garbage hello: close code %d", code)
	}
	// An older protocol version: closed with PROTOCOL_VERSION and a reason.
	w = b.dialRaw("old")
	w.write(&pb.Envelope{Body: &pb.Envelope_Hello{Hello: &pb.Hello{WorkerId: "old", MaxLabels: 1, Slots: 1}}})
	if code, text := w.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_PROTOCOL_VERSION) || !strings.Contains(text, "version") {
		t.Fatalf("old version: %d %q", code, text)
	}
	// A registered worker that sends garbage later is closed; others are unaffected.
	good := b.dial("good", "m")
	bad := b.dial("bad", "m")
	badConn := b.registered("bad")
	bad.ws.WriteMessage(websocket.BinaryMessage, []byte("not protobuf at all"))
	if code, _ := bad.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_BAD_FRAME) {
		t.Fatalf("garbage after hello: %d", code)
	}
	b.awaitGone(badConn)
	ans := b.postAsync(`{"task_type":"x","label":"m"}`)
	good.finish(good.assignment(), true, "{}")
	if got := <-ans; got.status != 200 {
		t.Fatalf("good worker after a bad one: %v", got)
	}
}

func TestSecondConnectionReplacesFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	first := b.dial("w1", "m")
	ans := b.postAsync(`{"task_id":"r1","task_type":"x","label":"m"}`)
	a := first.assignment()
	second := b.dial("w1", "m")
	if code, _ := first.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_REPLACED) {
		t.Fatalf("replaced connection got code %d", code)
	}
	// The task the first connection held runs again on the second, attempt 2; the
	// first connection's late result is not accepted.
	a2 := second.assignment()
	if a2.TaskId != a.TaskId || a2.Attempt != 2 {
		t.Fatalf("reassigned %v", a2)
	}
	second.finish(a2, true, `"second"`)
	if got := <-ans; got.status != 200 || got.body["result"] != "second" || got.body["attempts"] != float64(2) {
		t.Fatalf("answer %v", got)
	}
}

func TestSlowWorkerIsCutOff(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{SendQueueFrames: 1})
	w := b.dial("slow", "m")
	wc := b.registered("slow")
	// Fill the queue past its bound directly: the writer may drain one frame, so send
	// until the connection is closed with SLOW_WORKER.
	for i := 0; i < 1000; i++ {
		b.d.hub.mu.Lock()
		wc.send([]byte{0x9a, 0x00}) // an empty, well-formed Drain frame
		b.d.hub.mu.Unlock()
		select {
		case <-wc.closing:
			i = 1000
		default:
		}
	}
	if wc.reason == nil || wc.reason.Code != pb.CloseCode_CLOSE_CODE_SLOW_WORKER {
		t.Fatalf("reason %v", wc.reason)
	}
	_ = w
}

// run starts a dispatcher through Run, as the command does, on a free port. cancel
// stands for SIGTERM; Run's error arrives on runErr.
func run(t *testing.T, cfg Config) (b *bundle, cancel context.CancelFunc, runErr <-chan error) {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, ready) }()
	b = &bundle{t: t, d: d, srv: &httptest.Server{URL: "http://" + (<-ready).String()}}
	return b, cancel, done
}

func TestShutdownAnswersAndClosesWorkers(t *testing.T) {
	t.Parallel()
	b, cancel, runErr := run(t, Config{ShutdownTimeout: 5 * time.Second})
	w := b.dial("w1", "m")
	ans := b.postAsync(`{"task_type":"x","label":"m"}`)
	a := w.assignment()
	cancel() // SIGTERM: the in-flight task still finishes
	w.finish(a, true, "{}")
	if got := <-ans; got.status != 200 {
		t.Fatalf("in-flight task during shutdown: %v", got)
	}
	if code, _ := w.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_SHUTDOWN) {
		t.Fatalf("worker close code %d", code)
	}
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
}

// A worker that refuses an attempt (draining) does not fail the task: it runs on
// another worker and the producer gets that answer.
func TestRefusedAttemptRunsElsewhere(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	first := b.dial("w1", "m")
	ans := b.postAsync(`{"task_id":"ref-1","task_type":"x","label":"m"}`)
	a := first.assignment()
	second := b.dial("w2", "m")
	first.write(&pb.Envelope{Body: &pb.Envelope_Status{Status: &pb.WorkerStatus{Accepting: false, Reason: "draining"}}})
	first.write(&pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
		TaskId: a.TaskId, Attempt: a.Attempt, Error: "worker draining", Refused: true}}})
	a2 := second.assignment()
	if a2.TaskId != "ref-1" || a2.Attempt != 2 {
		t.Fatalf("reassigned %v", a2)
	}
	second.finish(a2, true, `"ok"`)
	if got := <-ans; got.status != 200 || got.body["worker_id"] != "w2" {
		t.Fatalf("answer %v", got)
	}
}
