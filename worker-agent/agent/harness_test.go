package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"github.com/smartroute/smartroute/worker-agent/agent"
	"github.com/smartroute/smartroute/worker-agent/backend/backendtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit bounds every wait in these tests; reaching it is a failure, never a signal.
const waitLimit = 10 * time.Second

// harness is a fake dispatcher (an httptest server speaking real WebSocket frames) and
// an agent Run against it.
type harness struct {
	t      testing.TB
	cfg    agent.Config
	fake   *backendtest.Fake // nil when the agent runs the sim backend
	srv    *httptest.Server
	conns  chan *peer // upgraded connections, in order
	logs   *syncBuffer
	cancel context.CancelFunc
	runErr chan error
	done   bool  // Run has returned
	err    error // what it returned

	mu     sync.Mutex
	peers  []*peer
	refuse int // when non-zero, the upgrade is refused with this HTTP status
	// dials receives every dial, refused or not; a dial that finds it full is not
	// recorded.
	dials chan dial
}

// dial is one upgrade request the fake dispatcher received.
type dial struct {
	auth string    // its Authorization header
	at   time.Time // when it arrived, before any answer was sent
}

type option func(*harness)

func withFake(f *backendtest.Fake) option { return func(h *harness) { h.fake = f; h.cfg.Backend = f } }
func withConfig(fn func(*agent.Config)) option {
	return func(h *harness) { fn(&h.cfg) }
}

// setup starts the fake dispatcher and, unless told not to, the agent.
func setup(t testing.TB, opts ...option) *harness {
	t.Helper()
	h := &harness{
		t:      t,
		conns:  make(chan *peer, 16),
		logs:   &syncBuffer{},
		runErr: make(chan error, 1),
		dials:  make(chan dial, 64),
	}
	upgrader := websocket.Upgrader{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		h.mu.Lock()
		refuse := h.refuse
		h.mu.Unlock()
		select {
		case h.dials <- dial{r.Header.Get("Authorization"), at}:
		default:
		}
		if refuse != 0 {
			http.Error(w, `{"error":"refused by test"}`, refuse)
			return
		}
		conn, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		p := &peer{t: t, conn: conn, workerID: r.Header.Get("Worker-Id")}
		h.mu.Lock()
		h.peers = append(h.peers, p)
		h.mu.Unlock()
		h.conns <- p
	}))
	h.cfg = agent.Config{
		DispatcherURL:    "ws" + strings.TrimPrefix(h.srv.URL, "http") + "/worker-listen",
		WorkerID:         "w-" + strings.ReplaceAll(t.Name(), "/", "-"),
		LogLevel:         "debug",
		LogOutput:        h.logs,
		HandshakeTimeout: 5 * time.Second,
		DrainTimeout:     5 * time.Second,
		ReconnectMin:     time.Millisecond,
		ReconnectMax:     5 * time.Millisecond,
	}
	for _, o := range opts {
		o(h)
	}
	t.Cleanup(h.cleanup)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.runErr <- agent.Run(ctx, h.cfg) }()
	return h
}

// cleanup stops the agent, answering its close handshake, and closes the server.
func (h *harness) cleanup() {
	h.cancel()
	if !h.done {
		h.mu.Lock()
		peers := append([]*peer(nil), h.peers...)
		h.mu.Unlock()
		for _, p := range peers {
			p.drainQuietly()
		}
		select {
		case h.err = <-h.runErr:
			h.done = true
		case <-time.After(waitLimit):
			h.t.Errorf("Run did not return after cancel")
		}
	}
	h.mu.Lock()
	for _, p := range h.peers {
		_ = p.conn.Close()
	}
	h.mu.Unlock()
	h.srv.Close()
	if h.fake != nil {
		for _, v := range h.fake.Violations() {
			h.t.Errorf("backend contract broken: %s", v)
		}
	}
	if h.t.Failed() {
		h.t.Logf("agent logs:\n%s", h.logs.String())
	}
}

// stop cancels the agent's context and returns what Run returned, answering the close
// handshake on p (which may be nil).
func (h *harness) stop(p *peer) error {
	h.t.Helper()
	h.cancel()
	if p != nil {
		p.drainQuietly()
	}
	return h.wait()
}

// wait returns what Run returned.
func (h *harness) wait() error {
	h.t.Helper()
	if h.done {
		return h.err
	}
	select {
	case h.err = <-h.runErr:
		h.done = true
		return h.err
	case <-time.After(waitLimit):
		h.t.Fatalf("Run did not return")
		return nil
	}
}

// accept returns the next connection the agent made.
func (h *harness) accept() *peer {
	h.t.Helper()
	select {
	case p := <-h.conns:
		return p
	case err := <-h.runErr:
		h.done, h.err = true, err
		h.t.Fatalf("Run returned %v while a connection was expected", err)
	case <-time.After(waitLimit):
		h.t.Fatalf("the agent did not connect")
	}
	return nil
}

// connect accepts the next connection, checks its hello and welcomes it.
func (h *harness) connect() *peer {
	h.t.Helper()
	return h.connectWith(&pb.Welcome{ProtocolVersion: frame.ProtocolVersion, DispatcherId: "test-dispatcher"})
}

// connectWith is connect with a Welcome of the test's own.
func (h *harness) connectWith(welcome *pb.Welcome) *peer {
	h.t.Helper()
	p := h.accept()
	env := p.read()
	hello, err := frame.CheckHello(env, p.workerID)
	if err != nil {
		h.t.Fatalf("bad hello %v: %v", env, err)
	}
	p.hello = hello
	p.send(&pb.Envelope{Body: &pb.Envelope_Welcome{Welcome: welcome}})
	return p
}

// logRecords parses the agent's JSON log lines; call it after Run returned.
func (h *harness) logRecords() []map[string]any {
	h.t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(h.logs.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			h.t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		out = append(out, rec)
	}
	return out
}

// recordsWith returns the log records whose field key equals value.
func (h *harness) recordsWith(key string, value any) []map[string]any {
	var out []map[string]any
	for _, r := range h.logRecords() {
		if r[key] == value {
			out = append(out, r)
		}
	}
	return out
}

// peer is the dispatcher's end of one connection. Only the test goroutine uses it.
type peer struct {
	t        testing.TB
	conn     *websocket.Conn
	workerID string
	hello    *pb.Hello
	events   []*pb.LabelEvent   // label events seen while waiting for other frames
	statuses []*pb.WorkerStatus // statuses seen while waiting for other frames
}

func (p *peer) readErr() (*pb.Envelope, error) {
	_ = p.conn.SetReadDeadline(time.Now().Add(waitLimit))
	kind, data, err := p.conn.ReadMessage()
	if err != nil {
		return nil, err
	}
	if kind != websocket.BinaryMessage {
		p.t.Fatalf("agent sent websocket message type %d", kind)
	}
	return frame.Decode(data, 0)
}

func (p *peer) read() *pb.Envelope {
	p.t.Helper()
	env, err := p.readErr()
	if err != nil {
		p.t.Fatalf("read from agent: %v", err)
	}
	return env
}

func (p *peer) send(env *pb.Envelope) {
	p.t.Helper()
	b, err := frame.Encode(nil, env)
	if err != nil {
		p.t.Fatal(err)
	}
	p.sendRaw(websocket.BinaryMessage, b)
}

func (p *peer) sendRaw(kind int, b []byte) {
	p.t.Helper()
	_ = p.conn.SetWriteDeadline(time.Now().Add(waitLimit))
	if err := p.conn.WriteMessage(kind, b); err != nil {
		p.t.Fatalf("write to agent: %v", err)
	}
}

func (p *peer) assign(asg *pb.TaskAssignment) {
	p.t.Helper()
	if asg.Attempt == 0 {
		asg.Attempt = 1
	}
	p.send(&pb.Envelope{Body: &pb.Envelope_Assignment{Assignment: asg}})
}

// next reads until a frame that is not a label event or status, recording those.
func (p *peer) next() *pb.Envelope {
	p.t.Helper()
	for {
		env := p.read()
		switch {
		case env.GetLabelEvent() != nil:
			p.events = append(p.events, env.GetLabelEvent())
		case env.GetStatus() != nil:
			p.statuses = append(p.statuses, env.GetStatus())
		default:
			return env
		}
	}
}

// result reads the next task result.
func (p *peer) result() *pb.TaskResult {
	p.t.Helper()
	env := p.next()
	if env.GetResult() == nil {
		p.t.Fatalf("got %v, want a task result", env)
	}
	return env.GetResult()
}

// run assigns one task and returns its result.
func (p *peer) run(taskID, label, evict string) *pb.TaskResult {
	p.t.Helper()
	p.assign(&pb.TaskAssignment{TaskId: taskID, TaskType: "sample_task", Label: label, EvictLabel: evict, ParametersJson: []byte(`{"data":"sample"}`)})
	r := p.result()
	if r.GetTaskId() != taskID {
		p.t.Fatalf("result for %q, want %q", r.GetTaskId(), taskID)
	}
	return r
}

// status reads until the next status frame.
func (p *peer) status() *pb.WorkerStatus {
	p.t.Helper()
	for {
		env := p.read()
		if st := env.GetStatus(); st != nil {
			return st
		}
		if ev := env.GetLabelEvent(); ev != nil {
			p.events = append(p.events, ev)
			continue
		}
		p.t.Fatalf("got %v, want a status", env)
	}
}

// event returns the first label event of kind for label, among those recorded or, if
// none is, the next frames; statuses on the way are recorded, other frames fail the
// test.
func (p *peer) event(kind pb.LabelEvent_Kind, label string) *pb.LabelEvent {
	p.t.Helper()
	match := func(ev *pb.LabelEvent) bool { return ev.GetKind() == kind && ev.GetLabel() == label }
	for _, ev := range p.events {
		if match(ev) {
			return ev
		}
	}
	for {
		env, err := p.readErr()
		if err != nil {
			p.t.Fatalf("no %s %s came (events so far %q): %v", kind, label, p.eventKinds(), err)
		}
		switch {
		case env.GetLabelEvent() != nil:
			p.events = append(p.events, env.GetLabelEvent())
			if match(env.GetLabelEvent()) {
				return env.GetLabelEvent()
			}
		case env.GetStatus() != nil:
			p.statuses = append(p.statuses, env.GetStatus())
		default:
			p.t.Fatalf("got %v while waiting for %s %s (events so far %q)", env, kind, label, p.eventKinds())
		}
	}
}

// closeCode reads until the connection ends and returns the agent's close code, or -1
// if it ended without a close frame. Frames before the close are recorded.
func (p *peer) closeCode() int {
	p.t.Helper()
	for {
		env, err := p.readErr()
		if err == nil {
			switch {
			case env.GetLabelEvent() != nil:
				p.events = append(p.events, env.GetLabelEvent())
			case env.GetStatus() != nil:
				p.statuses = append(p.statuses, env.GetStatus())
			default:
				p.t.Fatalf("got %v, want the connection to close", env)
			}
			continue
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Code
		}
		return -1
	}
}

// drainQuietly reads until the connection ends, which answers a close frame.
func (p *peer) drainQuietly() {
	for {
		_ = p.conn.SetReadDeadline(time.Now().Add(waitLimit))
		if _, _, err := p.conn.ReadMessage(); err != nil {
			return
		}
	}
}

// closeWith sends a close frame with code.
func (p *peer) closeWith(code int, reason string) {
	p.t.Helper()
	msg := websocket.FormatCloseMessage(code, reason)
	if err := p.conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(waitLimit)); err != nil {
		p.t.Fatalf("send close: %v", err)
	}
}

// eventKinds renders the recorded label events as "KIND label" strings.
func (p *peer) eventKinds() []string {
	var out []string
	for _, ev := range p.events {
		out = append(out, strings.TrimPrefix(ev.GetKind().String(), "KIND_")+" "+ev.GetLabel())
	}
	return out
}

// syncBuffer is a bytes.Buffer safe for the agent's logger and the test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
