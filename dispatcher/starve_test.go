package dispatcher

import (
	"net/http"
	"testing"
	"time"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// settled waits until the hub has answered task id and finished acting on the
// result that answered it (onResult holds the hub's lock from the answer through the
// assignments that follow).
func (b *bundle) settled(id string) {
	b.t.Helper()
	rec := b.d.hub.known(id)
	if rec == nil {
		b.t.Fatalf("task %s unknown", id)
	}
	<-rec.done
	b.d.hub.mu.Lock()
	b.d.hub.mu.Unlock() //nolint:staticcheck // a barrier
}

func (b *bundle) status(id string) string {
	b.t.Helper()
	rec := b.d.hub.known(id)
	if rec == nil {
		b.t.Fatalf("task %s unknown", id)
	}
	return b.d.hub.viewOf(rec).Status
}

func (b *bundle) submitAsync(id, label string) {
	b.t.Helper()
	if code, out := b.post("/run-task", `{"task_id":"`+id+`","task_type":"x","label":"`+label+`","return_result":false,"timeout_ms":3600000}`); code != http.StatusAccepted {
		b.t.Fatalf("submit %s: %d %v", id, code, out)
	}
}

// Rule 4 end to end: no task is passed over for longer than the larger of 2 s and 100
// load times of its label, on a worker with more slots than labels too. Its labels all
// in use, it cannot take the aged task (a label in use is never evicted); while they
// kept getting tasks it never emptied, and the aged task waited until its deadline.
func TestAgedTaskNotStarvedOnMultiSlotWorker(t *testing.T) {
	t.Parallel()
	clock := &testClock{now: time.Now()}
	b := setup(t, Config{Clock: clock})
	w := b.dialHello(&pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: "w1", MaxLabels: 1, Slots: 2, HeldLabels: []string{"a"}})
	b.submitAsync("a1", "a")
	b.submitAsync("a2", "a")
	first, second := w.assignment(), w.assignment()
	b.submitAsync("b1", "b") // w1's only label is in use: b1 waits
	b.submitAsync("a3", "a")
	if s := b.status("b1"); s != "queued" {
		t.Fatalf("b1 is %s, want queued", s)
	}
	// Past b1's pass-over bound: max(2 s, 100 x 400 ms prior) = 40 s.
	clock.advance(time.Minute)

	// The two attempts that were running when b1's bound ran out finish. The freed
	// slots must not go to newer "a" tasks ahead of b1 for ever.
	w.finish(first, true, `"ok"`)
	b.settled(first.TaskId)
	w.finish(second, true, `"ok"`)
	b.settled(second.TaskId)
	if s := b.status("b1"); s != "running" {
		t.Fatalf("b1, passed over for %v (bound 40 s), is still %s after both of w1's older tasks finished; a3 is %s on w1 ahead of it",
			time.Minute, s, b.status("a3"))
	}
}
