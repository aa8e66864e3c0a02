package dispatcher

import (
	"net"
	"os"
	"sync"
	"time"
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

// newStallListener is a wrap for setupListener; it fills in l.
func newStallListener(l **stallListener) func(net.Listener) net.Listener {
	return func(inner net.Listener) net.Listener {
		*l = &stallListener{Listener: inner, conns: make(map[string]*stallConn)}
		return *l
	}
}
