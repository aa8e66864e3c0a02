package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/smartroute/smartroute/proto/frame"
)

// A worker whose socket has stopped draining holds up its own ping only: a round of
// pings returns at once and a healthy worker is pinged meanwhile. Done in turn, each
// such worker held the round (and, before pings left the background loop, every
// deadline check) for up to the write timeout.
func TestStuckWorkerDoesNotHoldUpOtherPings(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{PingInterval: time.Hour, WriteTimeout: time.Hour}) // rounds run by hand
	healthy := b.dial("healthy", "m")
	stuck := b.dial("stuck", "m") // never reads again
	pinged := make(chan struct{}, 1)
	healthy.ws.SetPingHandler(func(string) error { pinged <- struct{}{}; return nil })
	go func() { // the healthy worker reads, as a worker does, until the test ends
		for {
			if _, _, err := healthy.ws.ReadMessage(); err != nil {
				return
			}
		}
	}()

	b.d.hub.mu.Lock()
	wc := b.d.hub.workers["stuck"]
	big := make([]byte, 1<<20)
	for range 32 { // far more than the loopback socket buffers hold
		wc.send(big)
	}
	b.d.hub.mu.Unlock()
	// Stuck once the flusher has taken every frame and not finished writing them.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		wc.pendingMu.Lock()
		taken := len(wc.pending) == 0 && wc.flushing
		wc.pendingMu.Unlock()
		if taken {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the flusher never took the frames")
		}
	}

	p := frame.NewPinger(frame.MaxPings)
	// A ping written while the flusher still gathers its batch joins the batch and
	// returns; once the batch's write is under way, a ping waits for it. Rounds go on
	// until the stuck worker's ping is outstanding.
	for attempt := 0; !wc.pinging.Load(); attempt++ {
		if attempt == 1000 {
			t.Fatal("the stuck worker's ping never stuck")
		}
		round := make(chan bool, 1)
		go func() { round <- b.d.pingRound(context.Background(), p) }()
		select {
		case ok := <-round:
			if !ok {
				t.Fatal("pingRound reported its context ended")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a round of pings waited on the stuck worker")
		}
		select {
		case <-pinged:
		case <-time.After(10 * time.Second):
			t.Fatal("the healthy worker was not pinged")
		}
		for deadline := time.Now().Add(10 * time.Second); p.InFlight() > 1 || p.InFlight() == 1 && !wc.pinging.Load(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d pings still outstanding", p.InFlight())
			}
		}
	}
	// Another round does not pile a second ping onto the stuck worker.
	within(t, "another round of pings", func() { b.d.pingRound(context.Background(), p) })
	select {
	case <-pinged:
	case <-time.After(10 * time.Second):
		t.Fatal("the healthy worker was not pinged in the next round")
	}
	for deadline := time.Now().Add(10 * time.Second); p.InFlight() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d pings outstanding after another round, want the stuck worker's one", p.InFlight())
		}
	}
	stuck.ws.Close() // the write fails, and the ping with it
	within(t, "the stuck worker's ping after its socket closed", p.Wait)
}

// within fails the test if fn has not returned after 10 s, rather than hanging it.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { fn(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still waiting after 10s", what)
	}
}
