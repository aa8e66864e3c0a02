package logcollector

import (
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// slotsHeld starts a collector with one batch slot whose holder is stopped inside its
// write: worker "a"'s first batch is written and not yet acknowledged until release is
// closed. It returns the collector, a's stream and the channel of waiting streams.
func slotsHeld(t *testing.T) (r *running, a *agentConn, waits <-chan string, release chan<- struct{}) {
	t.Helper()
	held, rel, w := make(chan struct{}), make(chan struct{}), make(chan string, 4)
	r = startCollector(t, Config{MaxActiveBatches: 1, hooks: &testHooks{batchWaits: w,
		afterWrite: func(worker string, _ uint64) error {
			if worker == "a" {
				close(held)
				<-rel
			}
			return nil
		}}})
	a, _ = connect(t, r.ingestURL(), "a", "sa")
	a.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: &pb.LogBatch{Seq: 1, Records: [][]byte{[]byte(`{"n":1}`)}}}})
	<-held
	return r, a, w, rel
}

// A batch that finds every slot taken waits, then is written and acknowledged once a
// slot frees: nothing is refused or lost, only held back.
func TestBatchBeyondTheSlotsWaitsItsTurn(t *testing.T) {
	t.Parallel()
	r, a, waits, release := slotsHeld(t)
	b, _ := connect(t, r.ingestURL(), "b", "sb")
	acked := make(chan uint64, 1)
	go func() { acked <- b.batch(1, 0, `{"n":2}`) }()
	if w := waitingStream(t, waits); w != "b" {
		t.Fatalf("waiting stream %q, want b", w)
	}
	if got := lines(t, r.dir, "b"); len(got) != 0 {
		t.Fatalf("b's batch written while a held the only slot: %q", got)
	}
	close(release)
	if env, err := a.read(); err != nil || env.GetAck().GetSeq() != 1 {
		t.Fatalf("a's ack: %v %v", env, err)
	}
	if seq := <-acked; seq != 1 {
		t.Fatalf("b acked %d, want 1", seq)
	}
	if got := lines(t, r.dir, "b"); len(got) != 1 || got[0] != `{"n":2}` {
		t.Fatalf("b's lines %q", got)
	}
	if n := testutil.ToFloat64(r.c.met.batchWaits); n != 1 {
		t.Fatalf("batch_slot_waits_total = %v, want 1", n)
	}
}

// A stream waiting for a slot still ends when the collector shuts down: its handler
// does not hold shutdown up behind the slot's holder.
func TestStreamWaitingForASlotEndsOnShutdown(t *testing.T) {
	t.Parallel()
	r, _, waits, release := slotsHeld(t)
	b, _ := connect(t, r.ingestURL(), "b", "sb")
	b.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: &pb.LogBatch{Seq: 1, Records: [][]byte{[]byte(`{"n":2}`)}}}})
	waitingStream(t, waits)
	stopped := make(chan struct{})
	go func() { r.stop(); close(stopped) }()
	if code := b.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_SHUTDOWN) {
		t.Fatalf("b closed with %d, want SHUTDOWN", code)
	}
	close(release) // a's handler, inside its write, is what shutdown still waits for
	<-stopped
	if got := lines(t, r.dir, "b"); len(got) != 0 {
		t.Fatalf("b's batch written after its stream closed: %q", got)
	}
}

// waitingStream returns the next stream that waits for a slot; it fails the test when
// none does within 10 seconds (a bound on failure, not a synchronisation).
func waitingStream(t *testing.T, waits <-chan string) string {
	t.Helper()
	select {
	case w := <-waits:
		return w
	case <-time.After(10 * time.Second):
		t.Fatal("no stream waited for a batch slot")
		return ""
	}
}

// The collector pings every stream (one ticker for all of them): an agent that only
// listens still sees pings, as the protocol says both sides send them.
func TestCollectorPingsEveryStream(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{PingInterval: 20 * time.Millisecond, ReadTimeout: time.Minute})
	pinged := make(chan string, 8)
	for _, w := range []string{"p1", "p2"} {
		a, _ := connect(t, r.ingestURL(), w, "s-"+w)
		a.ws.SetPingHandler(func(string) error {
			select {
			case pinged <- w:
			default:
			}
			return nil
		})
		go func() { // read until the stream ends, as an agent does
			for {
				if _, _, err := a.ws.ReadMessage(); err != nil {
					return
				}
			}
		}()
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		select {
		case w := <-pinged:
			seen[w] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("pinged only %v", seen)
		}
	}
}

// A frame that has taken a slot must arrive whole within ReadTimeout, pings or not. A
// stream that sent one fragment of a frame and then only pinged (or answered the
// collector's pings) held the slot for ever: with MaxActiveBatches such streams,
// every worker's ingest stopped. Between frames pings still keep a stream up.
func TestUnfinishedFrameHoldsItsSlotOnlyForReadTimeout(t *testing.T) {
	t.Parallel()
	const readTimeout = 300 * time.Millisecond
	waits, taken := make(chan string, 4), make(chan string, 4)
	r := startCollector(t, Config{MaxActiveBatches: 1, ReadTimeout: readTimeout, PingInterval: 50 * time.Millisecond,
		hooks: &testHooks{batchWaits: waits, slotTaken: taken}})

	slow, _ := connect(t, r.ingestURL(), "slow", "s1")
	slowEnded := make(chan error, 1)
	go func() { // answers the collector's pings (gorilla's default handler) until the end
		for {
			if _, _, err := slow.ws.ReadMessage(); err != nil {
				slowEnded <- err
				return
			}
		}
	}()
	fw, err := slow.ws.NextWriter(websocket.BinaryMessage)
	if err != nil {
		t.Fatal(err)
	}
	// More than the write buffer: a non-final fragment goes out, the frame stays open.
	if _, err := fw.Write(make([]byte, 16<<10)); err != nil {
		t.Fatal(err)
	}
	if w := <-taken; w != "slow" {
		t.Fatalf("slot taken by %q, want slow", w)
	}
	stopPings := make(chan struct{})
	pingsDone := make(chan struct{})
	go func() { // and pings the collector itself, more often than ReadTimeout
		defer close(pingsDone)
		tick := time.NewTicker(readTimeout / 6)
		defer tick.Stop()
		for {
			select {
			case <-stopPings:
				return
			case <-tick.C:
				if slow.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second)) != nil {
					return
				}
			}
		}
	}()
	defer func() { close(stopPings); <-pingsDone }()

	victim, _ := connect(t, r.ingestURL(), "victim", "s1")
	pings := make(chan struct{}, 64)
	victim.ws.SetPingHandler(func(data string) error {
		select {
		case pings <- struct{}{}:
		default:
		}
		return victim.ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
	})
	frames := make(chan *pb.LogEnvelope, 4)
	go func() {
		defer close(frames)
		for {
			env, err := victim.read()
			if err != nil {
				return
			}
			frames <- env
		}
	}()
	ack := func(seq uint64) {
		t.Helper()
		select {
		case env := <-frames:
			if env.GetAck().GetSeq() != seq {
				t.Fatalf("victim got %v, want the ack of %d", env, seq)
			}
		case <-time.After(20 * readTimeout): // a bound on failure
			t.Fatalf("victim's batch %d unacknowledged after %s (ReadTimeout %s): the unfinished frame holds the only slot",
				seq, 20*readTimeout, readTimeout)
		}
	}
	victim.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: &pb.LogBatch{Seq: 1, Records: [][]byte{[]byte(`{"n":1}`)}}}})
	if w := waitingStream(t, waits); w != "victim" {
		t.Fatalf("waiting stream %q, want victim", w)
	}
	ack(1)
	if err := <-slowEnded; err == nil {
		t.Fatal("the slow stream was not ended")
	}

	// Idle for more than ReadTimeout of pings (each 50 ms), the victim's stream is up.
	for range 2 * readTimeout / (50 * time.Millisecond) {
		select {
		case <-pings:
		case <-time.After(20 * readTimeout):
			t.Fatal("no ping from the collector")
		}
	}
	victim.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: &pb.LogBatch{Seq: 2, Records: [][]byte{[]byte(`{"n":2}`)}}}})
	ack(2)
}
