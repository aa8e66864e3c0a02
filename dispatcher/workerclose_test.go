package dispatcher

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// stallListener wraps the server's listener so that a test can make the dispatcher's
// writes to one connection block, as they do when the peer stops reading and the
// socket buffers are full, without sending megabytes to fill them.
type stallListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[string]*stallConn // by the client's address
}

func (l *stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	sc := &stallConn{Conn: c, closed: make(chan struct{})}
	l.mu.Lock()
	l.conns[c.RemoteAddr().String()] = sc
	l.mu.Unlock()
	return sc, nil
}

// conn is the server's side of the connection a client opened from addr.
func (l *stallListener) conn(addr net.Addr) *stallConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[addr.String()]
}

// stallConn is a server-side connection whose writes can be stalled. A stalled write
// waits until the stall ends, the write deadline passes (the deadline in force when
// the write began) or the connection is closed, as a write to a full socket does.
type stallConn struct {
	net.Conn
	mu        sync.Mutex
	stalled   chan struct{} // closed when the stall ends; nil when not stalled
	deadline  time.Time
	closed    chan struct{}
	closeOnce sync.Once
}

func (c *stallConn) stall() {
	c.mu.Lock()
	if c.stalled == nil {
		c.stalled = make(chan struct{})
	}
	c.mu.Unlock()
}

func (c *stallConn) resume() {
	c.mu.Lock()
	if c.stalled != nil {
		close(c.stalled)
		c.stalled = nil
	}
	c.mu.Unlock()
}

func (c *stallConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	stalled, deadline := c.stalled, c.deadline
	c.mu.Unlock()
	if stalled != nil {
		var expired <-chan time.Time
		if !deadline.IsZero() {
			t := time.NewTimer(time.Until(deadline))
			defer t.Stop()
			expired = t.C
		}
		select {
		case <-stalled:
		case <-c.closed:
			return 0, net.ErrClosed
		case <-expired:
			return 0, os.ErrDeadlineExceeded
		}
	}
	return c.Conn.Write(p)
}

func (c *stallConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *stallConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *stallConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// A worker the dispatcher cuts off (here SLOW_WORKER, its socket no longer draining)
// leaves the routing at once: the tasks it was given are requeued and run elsewhere,
// and no new task is routed to it. Before, it stayed until its reader ended, which
// waited for the close frame, and that frame waits up to the write timeout on exactly
// such a socket: tasks given to it meanwhile were never sent.
func TestClosedWorkerLeavesTheRoutingAtOnce(t *testing.T) {
	t.Parallel()
	sl := &stallListener{conns: make(map[string]*stallConn)}
	// The write timeout outlasts the test: the close frame to the stalled worker
	// cannot be written while the test runs.
	b := setupListener(t, Config{SendQueueFrames: 2, WriteTimeout: time.Hour, PingInterval: time.Hour},
		func(l net.Listener) net.Listener { sl.Listener = l; return sl })
	slow := b.dialHello(&pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: "slow", MaxLabels: 2, Slots: 8, HeldLabels: []string{"m"}})
	other := b.dial("other") // holds no label: the idle holder "slow" wins while it is routed
	sc := sl.conn(slow.ws.LocalAddr())
	if sc == nil {
		t.Fatal("the slow worker's connection was not seen by the listener")
	}
	sc.stall()
	t.Cleanup(sc.resume) // runs before setup's cleanup, which waits for the connections

	wc := b.d.hub.workers["slow"]
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
