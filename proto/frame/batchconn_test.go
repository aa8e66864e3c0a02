package frame

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"
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
