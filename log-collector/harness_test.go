package logcollector

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// running is a collector served by Run on a loopback port.
type running struct {
	t    testing.TB
	c    *Collector
	addr string
	dir  string
	stop func() // cancels Run and waits for it; idempotent
}

// startCollector runs a collector on cfg (Dir and Addr default to a temp dir and a
// free port) until the test ends or stop is called.
func startCollector(t testing.TB, cfg Config) *running {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, ready) }()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	}
	r := &running{t: t, c: c, addr: addr.String(), dir: cfg.Dir}
	stopped := false
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(r.stop)
	return r
}

func (r *running) ingestURL() string { return "ws://" + r.addr + "/ingest" }

func (r *running) get(path string) (int, []byte) {
	r.t.Helper()
	resp, err := http.Get("http://" + r.addr + path)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp.StatusCode, b
}

// agentConn is a hand-driven agent stream on a real WebSocket.
type agentConn struct {
	t  testing.TB
	ws *websocket.Conn
}

func dialIngest(t testing.TB, url, worker string) (*agentConn, *http.Response, error) {
	t.Helper()
	h := http.Header{}
	if worker != "" {
		h.Set("Worker-Id", worker)
	}
	ws, resp, err := websocket.DefaultDialer.Dial(url, h)
	if err != nil {
		return nil, resp, err
	}
	t.Cleanup(func() { ws.Close() })
	return &agentConn{t: t, ws: ws}, resp, nil
}

// connect dials and says hello; it returns the welcome's last_seq.
func connect(t testing.TB, url, worker, stream string) (*agentConn, uint64) {
	t.Helper()
	a, _, err := dialIngest(t, url, worker)
	if err != nil {
		t.Fatal(err)
	}
	a.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Hello{Hello: &pb.LogHello{
		ProtocolVersion: pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT, WorkerId: worker, StreamId: stream}}})
	env, err := a.read()
	if err != nil || env.GetWelcome() == nil {
		t.Fatalf("welcome: %v %v", env, err)
	}
	return a, env.GetWelcome().GetLastSeq()
}

func (a *agentConn) send(env *pb.LogEnvelope) {
	a.t.Helper()
	b, err := proto.Marshal(env)
	if err != nil {
		a.t.Fatal(err)
	}
	if err := a.ws.WriteMessage(websocket.BinaryMessage, b); err != nil {
		a.t.Fatal(err)
	}
}

func (a *agentConn) read() (*pb.LogEnvelope, error) {
	_ = a.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, data, err := a.ws.ReadMessage()
	if err != nil {
		return nil, err
	}
	env := new(pb.LogEnvelope)
	return env, proto.Unmarshal(data, env)
}

// batch sends a batch and returns the acknowledged seq.
func (a *agentConn) batch(seq, dropped uint64, records ...string) uint64 {
	a.t.Helper()
	b := &pb.LogBatch{Seq: seq, Dropped: dropped}
	for _, r := range records {
		b.Records = append(b.Records, []byte(r))
	}
	a.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: b}})
	env, err := a.read()
	if err != nil || env.GetAck() == nil {
		a.t.Fatalf("ack of batch %d: %v %v", seq, env, err)
	}
	return env.GetAck().GetSeq()
}

// closeCode reads until the collector closes the stream and returns the close code.
func (a *agentConn) closeCode() int {
	a.t.Helper()
	return a.closeFrame().Code
}

// closeFrame reads until the collector closes the stream and returns its close frame.
func (a *agentConn) closeFrame() *websocket.CloseError {
	a.t.Helper()
	for {
		env, err := a.read()
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce
		}
		if err != nil {
			a.t.Fatalf("read: %v, want a close frame", err)
		}
		if env.GetAck() != nil {
			a.t.Fatalf("ack of batch %d, want a close frame", env.GetAck().GetSeq())
		}
	}
}

// lines returns the lines of every data file of worker, oldest first.
func lines(t *testing.T, dir, worker string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, dirName(worker), "*"+dataSuffix))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files { // Glob sorts; the names are zero-padded
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.SplitSeq(strings.TrimSuffix(string(b), "\n"), "\n") {
			if l != "" {
				out = append(out, l)
			}
		}
	}
	return out
}

func readState(t *testing.T, dir, worker string) workerState {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, dirName(worker), stateFile))
	if err != nil {
		t.Fatal(err)
	}
	var st workerState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// dirName is workerDirName's name alone.
func dirName(worker string) string {
	name, _ := workerDirName(worker)
	return name
}

func protoMarshal(env *pb.LogEnvelope) ([]byte, error) { return proto.Marshal(env) }
