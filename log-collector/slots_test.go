package logcollector

import (
	"testing"
	"time"

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
