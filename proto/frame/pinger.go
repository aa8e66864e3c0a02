package frame

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Pinger writes WebSocket pings for a server's many connections from one ticker rather
// than a goroutine per connection. A ping to a peer whose socket has stopped draining
// can wait out a whole write deadline; done in turn, a few such peers would hold every
// other ping back past its pong deadline. So each ping runs on a goroutine of its own,
// at most Max at once, and a connection whose last ping is still being written gets no
// second one.
type Pinger struct {
	slots chan struct{}
	wg    sync.WaitGroup
}

// MaxPings is how many pings a server's Pinger writes at once.
const MaxPings = 64

// PingEvery runs round every interval until ctx ends or round reports false, with a
// Pinger of MaxPings, and waits for its pings before it returns.
func PingEvery(ctx context.Context, every time.Duration, round func(context.Context, *Pinger) bool) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	p := NewPinger(MaxPings)
	defer p.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !round(ctx, p) {
			return
		}
	}
}

// NewPinger returns a Pinger that writes at most max pings at once.
func NewPinger(max int) *Pinger { return &Pinger{slots: make(chan struct{}, max)} }

// Go runs ping on its own goroutine unless busy says the connection's last ping is still
// under way; busy is set meanwhile. It waits for a free slot and reports false, having
// started nothing, if ctx ends first.
func (p *Pinger) Go(ctx context.Context, busy *atomic.Bool, ping func()) bool {
	if !busy.CompareAndSwap(false, true) {
		return true
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		busy.Store(false)
		return false
	}
	p.wg.Go(func() {
		ping()
		busy.Store(false)
		<-p.slots
	})
	return true
}

// InFlight is how many pings are being written now.
func (p *Pinger) InFlight() int { return len(p.slots) }

// Wait waits for the pings under way.
func (p *Pinger) Wait() { p.wg.Wait() }
