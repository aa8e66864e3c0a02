package agent

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// notReady reads a.cur once: the run loop clears it (CompareAndSwap, not under a.mu),
// and a second read between could be nil, which /readyz dereferenced and panicked on
// instead of answering 503. A stress loop: it failed within a few dozen calls.
func TestNotReadyWhileTheSessionEnds(t *testing.T) {
	t.Parallel()
	a := &agent{available: true}
	s := &session{done: make(chan struct{})}
	if !s.markWelcomed(nil) {
		t.Fatal("markWelcomed")
	}
	var stop atomic.Bool
	flipped := make(chan struct{})
	go func() { // the run loop: a session comes and goes
		defer close(flipped)
		for !stop.Load() {
			a.cur.Store(s)
			a.cur.CompareAndSwap(s, nil)
		}
	}()
	defer func() { stop.Store(true); <-flipped }()
	for i := 0; i < 300_000; i++ {
		var p any
		func() {
			defer func() { p = recover() }()
			a.notReady()
		}()
		if p != nil {
			t.Fatalf("notReady panicked after %d calls: %v", i, fmt.Sprint(p))
		}
	}
}
