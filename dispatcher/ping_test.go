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
	var sl *stallListener
	b := setupListener(t, Config{PingInterval: time.Hour, WriteTimeout: time.Hour}, newStallListener(&sl)) // rounds run by hand
	healthy := b.dial("healthy", "m")
	stuck := b.dial("stuck", "m")
	pinged := make(chan struct{}, 1)
	healthy.ws.SetPingHandler(func(string) error { pinged <- struct{}{}; return nil })
	go func() { // the healthy worker reads, as a worker does, until the test ends
		for {
			if _, _, err := healthy.ws.ReadMessage(); err != nil {
				return
			}
		}
	}()
	// The stuck worker's socket stops draining: its writes wait out their deadline.
	sc := sl.conn(stuck.ws.LocalAddr())
	sc.stall()

	// Two frames queued at once, as send does, so that the flusher takes them as one
	// batch, whose single write the stalled socket then holds. (Queued one by one, the
	// flusher could take the first alone, and a lone frame's write holds gorilla's
	// writer lock, which a ping gives up on after its own deadline instead of sticking.)
	wc := b.registered("stuck")
	drain := []byte{0x9a, 0x00} // an empty, well-formed Drain frame
	wc.pendingMu.Lock()
	wc.pending = append(wc.pending, drain, drain)
	start := !wc.flushing
	wc.flushing = true
	wc.pendingMu.Unlock()
	if start {
		go wc.flush()
	}
	// Stuck once the flusher has taken both frames and not finished writing them.
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
	sc.Close() // the write fails, and the ping with it
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
