package frame

import (
	"net"
	"sync"
	"time"
)

// BatchConn lets a connection's one writer put several WebSocket frames into a single
// write(2). Between Hold and Flush, writes are gathered in memory; outside, they go
// straight through. Under load a worker connection often has a few frames waiting at
// once (assignments one way, results the other), and a system call per frame was the
// largest single cost of both ends.
//
// Any goroutine may write (gorilla/websocket serialises whole frames, and control
// frames such as pongs may come from the reader); a frame written while held simply
// joins the batch. Reads and everything else pass through to the wrapped Conn.
type BatchConn struct {
	net.Conn

	mu   sync.Mutex
	held bool
	buf  *[]byte // from batchBuffers while held; nil otherwise, so idle costs nothing
	// Write deadlines are not passed to the socket while they would not govern a
	// write. Set while held (gorilla sets one before every frame), the last one is
	// kept in batchDeadline for the batch's own write: one timer update per batch, not
	// per frame. Set while flushing (a ping's short one, from another goroutine), it
	// would cut the batch's write short, so it waits in afterFlush until the batch is
	// out.
	flushing         bool
	batchDeadline    time.Time
	hasBatchDeadline bool
	afterFlush       time.Time
	hasAfterFlush    bool
}

// NewBatchConn wraps c.
func NewBatchConn(c net.Conn) *BatchConn { return &BatchConn{Conn: c} }

// batchBuffers recycles the gathering buffers across connections.
var batchBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// maxKeptBatch bounds a buffer returned to the pool, so a rare huge frame is not kept.
const maxKeptBatch = 64 << 10

// Hold starts gathering writes.
func (c *BatchConn) Hold() {
	c.mu.Lock()
	if !c.held {
		c.held = true
		c.buf = batchBuffers.Get().(*[]byte)
	}
	c.mu.Unlock()
}

// Write gathers p while held and writes it through otherwise.
func (c *BatchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.held {
		*c.buf = append(*c.buf, p...)
		c.mu.Unlock()
		return len(p), nil
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// Flush writes what was gathered since Hold in one write and stops gathering. A write
// error is the connection's: the caller closes it, as for any failed write. Any
// goroutine may flush (one that wrote a close frame must, before closing the socket,
// in case the writer was holding); a nil BatchConn has nothing to flush.
func (c *BatchConn) Flush() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	if !c.held {
		c.mu.Unlock()
		return nil
	}
	c.held = false
	bp := c.buf
	c.buf = nil
	c.flushing = true
	deadline, hasDeadline := c.batchDeadline, c.hasBatchDeadline
	c.hasBatchDeadline = false
	c.mu.Unlock()
	defer c.flushed()
	if hasDeadline {
		if err := c.Conn.SetWriteDeadline(deadline); err != nil {
			return err
		}
	}
	// Written outside the lock: a frame written meanwhile goes straight through, which
	// may put it ahead of the batch, and that is fine, since gorilla wrote each frame
	// whole and a net.Conn's writes do not interleave.
	_, err := c.Conn.Write(*bp)
	if cap(*bp) <= maxKeptBatch {
		*bp = (*bp)[:0]
		batchBuffers.Put(bp)
	}
	return err
}

// flushed ends a flush and applies a write deadline set during it.
func (c *BatchConn) flushed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushing = false
	if c.hasAfterFlush {
		_ = c.Conn.SetWriteDeadline(c.afterFlush)
		c.hasAfterFlush = false
	}
}

// SetWriteDeadline sets the socket's write deadline. While writes are held it is kept
// for the batch's write; while a batch is being written, it is kept for when the batch
// is out: a frame written meanwhile waits for the socket anyway, and its deadline must
// not end the batch's write.
func (c *BatchConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.flushing:
		c.afterFlush, c.hasAfterFlush = t, true
		return nil
	case c.held:
		c.batchDeadline, c.hasBatchDeadline = t, true
		return nil
	}
	return c.Conn.SetWriteDeadline(t)
}
