package dispatcher

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

// lockedBuffer is a log sink the hub writes to while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Every load is a label miss, and at debug the dispatcher logs each with the rule that
// made it: what a run with more misses than expected is read by. The line is written
// before the assignment is sent, so it is there once the worker has the task.
func TestLoadIsLoggedWithItsReason(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	b := setup(t, Config{Logger: zerolog.New(&logs).Level(zerolog.DebugLevel)})
	w := b.dial("w1") // holds no label
	ans := b.postAsync(`{"task_id":"l1","task_type":"x","label":"m"}`)
	a := w.assignment()
	var line map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"label load assigned"`) {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if line == nil {
		t.Fatalf("no load logged in:\n%s", logs.String())
	}
	for k, want := range map[string]any{"level": "debug", "task_id": "l1", "worker_id": "w1", "label": "m", "reason": "no holder",
		"evict_label": "", "attempt": float64(1)} {
		if line[k] != want {
			t.Errorf("%s = %v, want %v in %v", k, line[k], want, line)
		}
	}
	if _, ok := line["delay_slack_ms"]; !ok {
		t.Errorf("no delay_slack_ms in %v", line)
	}
	w.finish(a, true, "{}")
	if got := <-ans; got.status != 200 {
		t.Fatalf("answer %v", got)
	}
}
