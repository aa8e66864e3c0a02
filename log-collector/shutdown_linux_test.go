//go:build linux

package logcollector

import (
	"context"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/protobuf/proto"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// Run stops within ShutdownTimeout even when agents stopped reading: it closed the
// streams one after another, each close frame given WriteTimeout, so k such agents
// held it k write timeouts (here an hour each), whatever ShutdownTimeout said.
func TestShutdownIsBoundedWhenAgentsStopReading(t *testing.T) {
	t.Parallel()
	cfg := Config{Dir: t.TempDir(), Addr: "127.0.0.1:0", WriteTimeout: time.Hour, ShutdownTimeout: 300 * time.Millisecond}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, ready) }()
	addr := (<-ready).String()

	small := func(_ string, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
	}
	d := websocket.Dialer{NetDialContext: (&net.Dialer{Control: small}).DialContext}
	const stuck = 3
	var conns []*websocket.Conn
	for i := 0; i < stuck; i++ {
		worker := "w" + string(rune('a'+i))
		ws, _, err := d.Dial("ws://"+addr+"/ingest", map[string][]string{"Worker-Id": {worker}})
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, ws)
		hello, _ := proto.Marshal(&pb.LogEnvelope{Body: &pb.LogEnvelope_Hello{Hello: &pb.LogHello{
			ProtocolVersion: pb.LogProtocolVersion_LOG_PROTOCOL_VERSION_CURRENT, WorkerId: worker, StreamId: "s"}}})
		if err := ws.WriteMessage(websocket.BinaryMessage, hello); err != nil {
			t.Fatal(err)
		}
		// Never read again: ping until our own write blocks, which it does only once
		// the collector's pong writes have filled both buffers and it stopped reading.
		payload := []byte(strings.Repeat("p", 125))
		for n := 0; ; n++ {
			if err := ws.WriteControl(websocket.PingMessage, payload, time.Now().Add(500*time.Millisecond)); err != nil {
				t.Logf("agent %s: collector stopped reading after %d pings (%v)", worker, n, err)
				break
			}
		}
	}
	defer func() {
		for _, ws := range conns {
			ws.Close()
		}
	}()
	cancel()
	select {
	case <-done: // an error is fine: the handlers may outlive the deadline by a moment
	case <-time.After(30 * time.Second): // a failure bound; unfixed it is an hour per agent
		t.Fatalf("Run still running 30 s after the stop with %d agents not reading; ShutdownTimeout is %s", stuck, cfg.ShutdownTimeout)
	}
}
