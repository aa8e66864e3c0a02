package dispatcher

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// A worker the dispatcher cuts off (here SLOW_WORKER, its socket no longer draining)
// leaves the routing at once: the tasks it was given are requeued and run elsewhere,
// and no new task is routed to it. Before, it stayed until its reader ended, which
// waited for the close frame, and that frame waits up to the write timeout on exactly
// such a socket: tasks given to it meanwhile were never sent.
func TestClosedWorkerLeavesTheRoutingAtOnce(t *testing.T) {
	t.Parallel()
	var sl *stallListener
	// The write timeout outlasts the test: the close frame to the stalled worker
	// cannot be written while the test runs.
	b := setupListener(t, Config{SendQueueFrames: 2, WriteTimeout: time.Hour, PingInterval: time.Hour}, newStallListener(&sl))
	slow := b.dialHello(&pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: "slow", MaxLabels: 2, Slots: 8, HeldLabels: []string{"m"}})
	other := b.dial("other") // holds no label: the idle holder "slow" wins while it is routed
	sc := sl.conn(slow.ws.LocalAddr())
	if sc == nil {
		t.Fatal("the slow worker's connection was not seen by the listener")
	}
	sc.stall()
	t.Cleanup(sc.resume) // runs before setup's cleanup, which waits for the connections

	wc := b.registered("slow")
	// Tasks for "slow" until its send queue overflows; it keeps free slots.
	var sent []string
	for i := 0; !wc.isClosing(); i++ {
		if i == 6 { // the flusher holds at most one batch of at most 2, and 2 more fill the queue
			t.Fatal("the stalled worker's send queue never overflowed")
		}
		id := fmt.Sprintf("t%d", i)
		if code, out := b.post("/run-task", `{"task_id":"`+id+`","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
			t.Fatalf("submit %s: %d %v", id, code, out)
		}
		sent = append(sent, id)
	}
	if wc.reason.Code != pb.CloseCode_CLOSE_CODE_SLOW_WORKER {
		t.Fatalf("closed with %v, want SLOW_WORKER", wc.reason)
	}
	// The tasks given to "slow" come back and run on the other worker, while "slow"'s
	// close frame is still waiting on its socket.
	a := other.assignment()
	if !contains(sent, a.TaskId) || a.Attempt != 2 {
		t.Fatalf("other worker got %s attempt %d, want a requeued task of %v", a.TaskId, a.Attempt, sent)
	}
	if contains(b.workers(), "slow") {
		t.Fatal("the closed worker is still listed")
	}
	select {
	case <-wc.read:
		t.Fatal("the reader ended: this test must show the worker leaving before it does")
	default:
	}
}

// A request to /worker-listen that is no WebSocket handshake is refused in JSON, as every
// error of the dispatcher is, not with the upgrader's plain-text "Bad Request".
func TestWorkerListenRefusesANonWebSocketRequestInJSON(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for _, h := range [][]string{
		{"Worker-Id", "w1"}, // a plain GET
		{"Worker-Id", "w1", "Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "12",
			"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}, // a version the dispatcher does not speak
	} {
		code, header, v := b.send("GET", "/worker-listen", "", h...) // send fails the test on a body that is not JSON
		if code != http.StatusBadRequest || header.Get("Content-Type") != "application/json" ||
			!strings.Contains(fmt.Sprint(v["error"]), "websocket") || header.Get("Sec-Websocket-Version") != "13" {
			t.Errorf("%q: %d %v %v; want 400 JSON naming the WebSocket handshake", h, code, header, v)
		}
	}
	b.untouched()
}
