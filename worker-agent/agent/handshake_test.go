package agent_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
	"github.com/smartroute/smartroute/worker-agent/backend/backendtest"
)

func TestHelloCarriesTheWorkersCapacityAndVersion(t *testing.T) {
	t.Parallel()
	h := setup(t, withConfig(func(c *agent.Config) {
		c.MaxLabels, c.Slots, c.Labels = 3, 2, []string{"m1", "m2"}
	}))
	p := h.connect()
	hello := p.hello
	if p.workerID != h.cfg.WorkerID || hello.GetWorkerId() != h.cfg.WorkerID {
		t.Errorf("Worker-Id header %q, hello worker_id %q, want %q", p.workerID, hello.GetWorkerId(), h.cfg.WorkerID)
	}
	if hello.GetProtocolVersion() != frame.ProtocolVersion {
		t.Errorf("protocol_version = %v, want %v", hello.GetProtocolVersion(), frame.ProtocolVersion)
	}
	if hello.GetMaxLabels() != 3 || hello.GetSlots() != 2 {
		t.Errorf("max_labels %d, slots %d, want 3 and 2", hello.GetMaxLabels(), hello.GetSlots())
	}
	if len(hello.GetHeldLabels()) != 0 {
		t.Errorf("held_labels = %q, want none", hello.GetHeldLabels())
	}
	if !slices.Equal(hello.GetLoadableLabels(), []string{"m1", "m2"}) {
		t.Errorf("loadable_labels = %q", hello.GetLoadableLabels())
	}
	if a := hello.GetAgent(); !strings.HasPrefix(a, "worker-agent ") || !strings.HasSuffix(a, " backend=sim") {
		t.Errorf("agent = %q", a)
	}
	if hello.GetUnavailable() {
		t.Error("the sim backend said it is unavailable")
	}
	// Welcomed: the connection works.
	if r := p.run("t1", "m1", ""); !r.GetOk() {
		t.Fatalf("result %v", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestGiveUpCloseCodes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		code         pb.CloseCode
		afterWelcome bool
	}{
		{"replaced", pb.CloseCode_CLOSE_CODE_REPLACED, true},
		{"protocol version", pb.CloseCode_CLOSE_CODE_PROTOCOL_VERSION, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			var p *peer
			if tc.afterWelcome {
				p = h.connect()
			} else {
				p = h.accept()
				p.read() // the hello
			}
			p.closeWith(int(tc.code), "test says "+tc.name)
			err := h.wait()
			var ce *agent.CloseError
			if !errors.As(err, &ce) || ce.Code != int(tc.code) {
				t.Fatalf("Run = %v, want a CloseError with code %d", err, tc.code)
			}
			if !strings.Contains(err.Error(), tc.code.String()) || !strings.Contains(err.Error(), "test says") {
				t.Errorf("error %q does not say which code and why", err)
			}
			select {
			case <-h.conns:
				t.Fatal("the agent reconnected after a give-up close code")
			default:
			}
		})
	}
}

// A refused token is retried with backoff, not given up on and not in a tight loop:
// once the dispatcher accepts the token again (the operator fixed its token file), the
// worker connects by itself. A connection closed with UNAUTHORIZED (a revoked token)
// does the same.
func TestRefusedTokenBacksOffAndRecovers(t *testing.T) {
	t.Parallel()
	h := setup(t, func(h *harness) {
		h.refuse = http.StatusUnauthorized
		h.cfg.WorkerToken = "tok-1"
		h.cfg.ReconnectMin, h.cfg.ReconnectMax = 20*time.Millisecond, 40*time.Millisecond
	})
	var dials [3]dial
	for i := range dials {
		select {
		case dials[i] = <-h.dials:
		case <-time.After(waitLimit):
			t.Fatalf("dial %d did not come", i+1)
		}
		if got := dials[i].auth; got != "Bearer tok-1" {
			t.Fatalf("dial %d sent Authorization %q", i+1, got)
		}
	}
	// Three dials are two waits of at least ReconnectMin/2 (jitter) apart. Timed from
	// the server's stamps: each is taken before that dial's refusal is sent, so both
	// waits fall wholly between the first and the third, however late this goroutine
	// runs.
	if el := dials[2].at.Sub(dials[0].at); el < 20*time.Millisecond {
		t.Fatalf("three refused dials within %v: no backoff", el)
	}
	// The agent logs a refusal before it waits to dial again: the third dial means the
	// first two refusals are logged.
	refusals := 0
	for _, r := range h.recordsWith("level", "error") {
		if msg, _ := r["message"].(string); strings.Contains(msg, "refused this worker's token") && strings.Contains(r["error"].(string), "refused by test") {
			refusals++
		}
	}
	if refusals < 2 {
		t.Fatalf("%d refusals logged by the third dial, want 2 or more", refusals)
	}
	h.mu.Lock()
	h.refuse = 0
	h.mu.Unlock()
	p := h.connect()
	// Revoked later: closed with UNAUTHORIZED, the worker dials again.
	p.closeWith(int(pb.CloseCode_CLOSE_CODE_UNAUTHORIZED), "worker token revoked")
	if p2 := h.connect(); p2.workerID != h.cfg.WorkerID {
		t.Fatalf("reconnected as %q", p2.workerID)
	}
	select {
	case err := <-h.runErr:
		t.Fatalf("Run returned %v; it must keep retrying", err)
	default:
	}
}

func TestReconnectSaysHelloWithHeldLabels(t *testing.T) {
	t.Parallel()
	slow := func(p *peer) { p.closeWith(int(pb.CloseCode_CLOSE_CODE_SLOW_WORKER), "too slow") }
	for _, tc := range []struct {
		name string
		drop func(p *peer)
		log  string // a message the agent logs on this path
		// resetAfter is BackoffResetAfter: a session that lived this long counts as
		// healthy (0: the default, 10s, longer than any of these sessions)
		resetAfter time.Duration
	}{
		{"network drop", func(p *peer) { _ = p.conn.NetConn().Close() }, "reconnecting after backoff", 0},
		{"shutdown", func(p *peer) { p.closeWith(int(pb.CloseCode_CLOSE_CODE_SHUTDOWN), "restarting") }, "reconnecting after backoff", 0},
		{"hello timeout", func(p *peer) { p.closeWith(int(pb.CloseCode_CLOSE_CODE_HELLO_TIMEOUT), "") }, "reconnecting after backoff", 0},
		{"slow worker", slow, "reconnecting at once", time.Nanosecond},
		// Cut off as slow soon after connecting: backoff, not a tight reconnect loop.
		{"slow worker again soon", slow, "reconnecting after backoff", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t, withConfig(func(c *agent.Config) { c.BackoffResetAfter = tc.resetAfter }))
			p := h.connect()
			p.run("t1", "a", "")
			p.run("t2", "b", "")
			p.run("t3", "a", "") // a is now the most recently used
			tc.drop(p)

			p2 := h.connect()
			if got := p2.hello.GetHeldLabels(); !slices.Equal(got, []string{"b", "a"}) {
				t.Errorf("held_labels after reconnect = %q, want [b a] (least recently used first)", got)
			}
			if r := p2.run("t4", "b", ""); !r.GetOk() || r.GetLabelMiss() {
				t.Errorf("after reconnect: %v, want a hit", r)
			}
			if err := h.stop(p2); err != nil {
				t.Fatalf("Run = %v", err)
			}
			if len(h.recordsWith("message", tc.log)) == 0 {
				t.Errorf("no %q record", tc.log)
			}
		})
	}
}

func TestBadFrameFromDispatcherReconnects(t *testing.T) {
	t.Parallel()
	helloFrame, err := frame.Encode(nil, &pb.Envelope{Body: &pb.Envelope_Hello{Hello: &pb.Hello{WorkerId: "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		kind int
		data []byte
	}{
		{"garbage", websocket.BinaryMessage, []byte{0xff, 0xff, 0xff}},
		{"empty", websocket.BinaryMessage, nil},
		{"text", websocket.TextMessage, []byte(`{"task_id":"t1"}`)},
		{"wrong direction", websocket.BinaryMessage, helloFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			p := h.connect()
			p.sendRaw(tc.kind, tc.data)
			if code := p.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_BAD_FRAME) {
				t.Errorf("agent closed with %d, want %d", code, pb.CloseCode_CLOSE_CODE_BAD_FRAME)
			}
			p2 := h.connect()
			if r := p2.run("t1", "a", ""); !r.GetOk() {
				t.Errorf("after reconnect: %v", r)
			}
			if err := h.stop(p2); err != nil {
				t.Fatalf("Run = %v", err)
			}
		})
	}
}

func TestFrameWithUnknownBodyIsSkipped(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.connect()
	// Field 99 of the envelope: a message type a newer dispatcher might add.
	unknown := protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), []byte{0x08, 0x01})
	p.sendRaw(websocket.BinaryMessage, unknown)
	if r := p.run("t1", "a", ""); !r.GetOk() {
		t.Fatalf("result %v", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
	select {
	case <-h.conns:
		t.Error("the agent reconnected")
	default:
	}
}

func TestUnavailableBackend(t *testing.T) {
	t.Parallel()
	fake := backendtest.New()
	fake.SetHealth(errors.New("triton is not live"))
	h := setup(t, withFake(fake), withConfig(func(c *agent.Config) { c.HealthInterval = 5 * time.Millisecond }))
	p := h.connect()
	if !p.hello.GetUnavailable() {
		t.Error("hello.unavailable = false for an unhealthy backend")
	}
	r := p.run("t1", "a", "")
	if r.GetOk() || !strings.Contains(r.GetError(), "triton is not live") {
		t.Errorf("result %v, want an error saying the backend is unavailable", r)
	}
	fake.SetHealth(nil)
	if st := p.status(); !st.GetAccepting() {
		t.Errorf("status %v, want accepting", st)
	}
	if r := p.run("t2", "a", ""); !r.GetOk() {
		t.Errorf("result %v", r)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestSilentDispatcherIsNoticed(t *testing.T) {
	t.Parallel()
	h := setup(t, withConfig(func(c *agent.Config) {
		c.ReadTimeout, c.PingInterval = 300*time.Millisecond, 100*time.Millisecond
	}))
	p := h.connect()
	p.run("t1", "a", "")
	// p stops reading, so the agent's pings go unanswered and its read deadline passes.
	p2 := h.connect()
	if got := p2.hello.GetHeldLabels(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("held_labels %q", got)
	}
	if err := h.stop(p2); err != nil {
		t.Fatalf("Run = %v", err)
	}
	var timedOut bool
	for _, r := range h.recordsWith("message", "disconnected") {
		timedOut = timedOut || strings.Contains(r["error"].(string), "timeout")
	}
	if !timedOut {
		t.Error("no disconnect for a read timeout was logged")
	}
}

// Shutdown while the dispatcher has taken the TCP connection but not answered the
// upgrade (a hung dispatcher, or a proxy whose upstream is down) ends the agent at once:
// gorilla/websocket heeds the dial's context only while connecting, so the agent had
// waited out HandshakeTimeout (10 s by default) before it could exit.
func TestShutdownCutsAnUnansweredUpgrade(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	requested := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil { // then say nothing
			requested <- c
		}
	}()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, agent.Config{DispatcherURL: "ws://" + ln.Addr().String() + "/worker-listen",
			WorkerID: "w-hung", LogOutput: io.Discard, HandshakeTimeout: time.Minute})
	}()
	c := <-requested
	defer c.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil after shutdown", err)
		}
	case <-time.After(20 * time.Second): // far below HandshakeTimeout
		c.Close()
		<-done
		t.Fatal("Run still waiting 20s after shutdown for an upgrade that was never answered")
	}
}
