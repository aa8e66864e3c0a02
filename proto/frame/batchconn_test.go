package frame

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// countingConn records each write it is given.
type countingConn struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
	err    error
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func TestBatchConnGathersHeldWrites(t *testing.T) {
	t.Parallel()
	under := &countingConn{}
	c := NewBatchConn(under)
	c.Write([]byte("a")) // not held: straight through
	c.Hold()
	c.Write([]byte("bb"))
	c.Write([]byte("ccc"))
	if len(under.writes) != 1 {
		t.Fatalf("%d writes reached the socket while held, want only the first", len(under.writes))
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil { // nothing held: a no-op
		t.Fatal(err)
	}
	c.Write([]byte("d"))
	want := []string{"a", "bbccc", "d"}
	if len(under.writes) != len(want) {
		t.Fatalf("writes %q, want %q", under.writes, want)
	}
	for i, w := range want {
		if string(under.writes[i]) != w {
			t.Fatalf("writes %q, want %q", under.writes, want)
		}
	}
}

func TestBatchConnFlushReportsTheWriteError(t *testing.T) {
	t.Parallel()
	broken := errors.New("broken pipe")
	c := NewBatchConn(&countingConn{err: broken})
	c.Hold()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatalf("a held write failed: %v", err)
	}
	if err := c.Flush(); !errors.Is(err, broken) {
		t.Fatalf("Flush = %v, want the socket's error", err)
	}
}

// deadlineConn records write deadlines and blocks writes until released.
type deadlineConn struct {
	net.Conn
	mu        sync.Mutex
	deadlines []time.Time
	writing   chan struct{} // receives when a write starts
	release   chan struct{} // a write returns once this is closed
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadlines = append(c.deadlines, t)
	return nil
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	c.writing <- struct{}{}
	<-c.release
	return len(p), nil
}

// A deadline set while a batch is being written (a ping's, from another goroutine)
// does not cut the batch's write short: it applies once the batch is out.
func TestBatchConnKeepsDeadlinesUntilTheBatchIsOut(t *testing.T) {
	t.Parallel()
	under := &deadlineConn{writing: make(chan struct{}, 1), release: make(chan struct{})}
	c := NewBatchConn(under)
	c.Hold()
	c.Write([]byte("frame"))
	done := make(chan error, 1)
	go func() { done <- c.Flush() }()
	<-under.writing // the batch's write is under way
	ping := time.Now().Add(time.Second)
	c.SetWriteDeadline(ping)
	under.mu.Lock()
	early := len(under.deadlines)
	under.mu.Unlock()
	close(under.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if early != 0 {
		t.Fatal("a deadline reached the socket while the batch was being written")
	}
	if len(under.deadlines) != 1 || !under.deadlines[0].Equal(ping) {
		t.Fatalf("deadlines after the flush %v, want the ping's", under.deadlines)
	}
}

// Deadlines set while writes are held reach the socket once, the last one, just before
// the batch's write: gorilla sets one per frame, and each was a timer update.
func TestBatchConnSetsOneDeadlinePerBatch(t *testing.T) {
	t.Parallel()
	under := &deadlineConn{writing: make(chan struct{}, 1), release: make(chan struct{})}
	close(under.release)
	c := NewBatchConn(under)
	c.Hold()
	first, last := time.Now().Add(time.Second), time.Now().Add(2*time.Second)
	c.SetWriteDeadline(first)
	c.Write([]byte("a"))
	c.SetWriteDeadline(last)
	c.Write([]byte("b"))
	under.mu.Lock()
	early := len(under.deadlines)
	under.mu.Unlock()
	if early != 0 {
		t.Fatalf("%d deadlines reached the socket while held, want none", early)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	<-under.writing
	if len(under.deadlines) != 1 || !under.deadlines[0].Equal(last) {
		t.Fatalf("deadlines %v, want only the last one set while held", under.deadlines)
	}
	c.SetWriteDeadline(first) // not held: straight through
	if len(under.deadlines) != 2 {
		t.Fatalf("deadline outside a batch did not reach the socket: %v", under.deadlines)
	}
}
