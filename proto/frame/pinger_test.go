package frame

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A connection whose ping is still being written gets no second one, the bound holds
// the next ping back, and a context that ends while it waits starts nothing.
func TestPingerSkipsBusyConnectionsAndBoundsPings(t *testing.T) {
	p := NewPinger(1)
	var stuck, next atomic.Bool
	started, release := make(chan struct{}), make(chan struct{})
	if !p.Go(context.Background(), &stuck, func() { close(started); <-release }) {
		t.Fatal("first ping not started")
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the first ping never ran")
	}
	if !p.Go(context.Background(), &stuck, func() { t.Error("a second ping to a busy connection") }) {
		t.Fatal("a busy connection's skip reported an ended context")
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if p.Go(ended, &next, func() { t.Error("a ping past the bound ran") }) {
		t.Fatal("Go reported success with its context ended and no slot free")
	}
	if next.Load() {
		t.Error("the connection whose ping never started is left busy")
	}
	if n := p.InFlight(); n != 1 {
		t.Errorf("InFlight = %d, want 1", n)
	}
	close(release)
	waited := make(chan struct{})
	go func() { p.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait still waiting 10s after the ping was released")
	}
	if stuck.Load() || p.InFlight() != 0 {
		t.Errorf("after Wait: busy %v, in flight %d", stuck.Load(), p.InFlight())
	}
}
