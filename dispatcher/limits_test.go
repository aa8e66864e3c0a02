package dispatcher

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

func TestParamsLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxParamsBytes: 64})
	big := `{"task_type":"x","label":"m","parameters_json":{"data":"` + strings.Repeat("a", 100) + `"}}`
	code, v := b.post("/run-task", big)
	if code != 413 || !strings.Contains(v["error"].(string), "parameters_json is 111 bytes, the limit is 64") {
		t.Fatalf("oversized parameters: %d %v", code, v)
	}
	b.untouched()
	if code, v := b.post("/run-task", `{"task_type":"x","label":"m","return_result":false,"parameters_json":{"a":1}}`); code != 202 {
		t.Fatalf("small parameters: %d %v", code, v)
	}
}

func TestPerLabelQueueLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxQueuedPerLabel: 2})
	for i := 0; i < 2; i++ {
		if code, v := b.post("/run-task", fmt.Sprintf(`{"task_id":"a%d","task_type":"x","label":"hot","return_result":false}`, i)); code != 202 {
			t.Fatalf("task %d: %d %v", i, code, v)
		}
	}
	code, header, v := b.send("POST", "/run-task", `{"task_id":"a2","task_type":"x","label":"hot","return_result":false}`)
	if code != 429 || header.Get("Retry-After") == "" || !strings.Contains(v["error"].(string), "queue full for label hot: 2 tasks waiting") {
		t.Fatalf("third task for the label: %d %v %v", code, header, v)
	}
	if code, _ := b.get("/tasks/a2"); code != 404 {
		t.Fatalf("a refused task is known: %d", code)
	}
	// Other labels are not held back by the hot one.
	if code, v := b.post("/run-task", `{"task_id":"c1","task_type":"x","label":"cold","return_result":false}`); code != 202 {
		t.Fatalf("another label: %d %v", code, v)
	}
	b.d.hub.mu.Lock()
	hot, all := b.d.hub.sched.Queued("hot"), b.d.hub.sched.QueuedTasks()
	b.d.hub.mu.Unlock()
	if hot != 2 || all != 3 {
		t.Fatalf("queued: hot %d, all %d; want 2 and 3", hot, all)
	}
}

// A frame over MaxFrameBytes closes the connection with 1009 (message too big), and
// the worker is forgotten.
func TestOversizedFrameClosesTheConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxFrameBytes: frame.MinMaxSize})
	w := b.dial("big", "m")
	wc := b.registered("big")
	// Only the header of a frame twice the limit (FIN and binary; masked, 64-bit
	// length; mask key): the dispatcher refuses it on the header. A whole frame would
	// leave bytes unread when it closes, and the kernel would reset the connection,
	// the close frame with it, while this end was still writing.
	header := binary.BigEndian.AppendUint64([]byte{0x82, 0x80 | 127}, 2*frame.MinMaxSize)
	if _, err := w.ws.NetConn().Write(append(header, 1, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	if code, _ := w.closeCode(); code != websocket.CloseMessageTooBig {
		t.Fatalf("close code %d, want %d", code, websocket.CloseMessageTooBig)
	}
	b.awaitGone(wc) // gorilla writes the 1009 close itself, before the reader ends
}

// The Welcome tells a worker the dispatcher's frame limit, so that the worker keeps its
// results within it rather than have its connection closed for one.
func TestWelcomeSaysTheFrameLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxFrameBytes: 64 << 10})
	w := b.dialRaw("w")
	w.write(&pb.Envelope{Body: &pb.Envelope_Hello{Hello: &pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: "w", MaxLabels: 1, Slots: 1}}})
	if got := w.read().GetWelcome().GetMaxFrameBytes(); got != 64<<10 {
		t.Fatalf("welcome's max_frame_bytes %d, want %d", got, 64<<10)
	}
}

func TestTotalQueueLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxQueued: 2})
	for i, label := range []string{"a", "b"} {
		if code, v := b.post("/run-task", fmt.Sprintf(`{"task_id":"q%d","task_type":"x","label":%q,"return_result":false}`, i, label)); code != 202 {
			t.Fatalf("task %d: %d %v", i, code, v)
		}
	}
	code, header, v := b.send("POST", "/run-task", `{"task_id":"q2","task_type":"x","label":"c","return_result":false}`)
	if code != 429 || header.Get("Retry-After") == "" || !strings.Contains(v["error"].(string), "queue full: 2 tasks waiting") {
		t.Fatalf("third task: %d %v %v", code, header, v)
	}
	if code, _ := b.get("/tasks/q2"); code != 404 {
		t.Fatalf("a refused task is known: %d", code)
	}
	if q := b.d.hub.sched.QueuedTasks(); q != 2 {
		t.Fatalf("queued %d, want 2", q)
	}
}

// Without credentials the dispatcher says at start that it runs in development mode.
func TestDevelopmentModeWarnsAtStart(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	_, cancel, done := run(t, Config{Logger: zerolog.New(&logs)})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `"level":"warn"`) || !strings.Contains(logs.String(), "development mode") {
		t.Fatalf("no development-mode warning in:\n%s", logs.String())
	}
}
