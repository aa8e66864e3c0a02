package logship

import (
	"bytes"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"
)

// lockedBuffer is a bytes.Buffer safe for the shipper's goroutine and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A collector that welcomes every stream but cannot write (its disk is full: it closes
// the stream with 1011 on the first batch) must see the agent back off, 100 ms doubling
// to 5 s as the README says, not come back at the minimum wait forever, resending up to
// MaxInFlight batches each time. Only a session that gets batches written proves the
// collector is well again.
func TestBackoffGrowsWhileTheCollectorWelcomesButCannotWrite(t *testing.T) {
	t.Parallel()
	const failing = 8
	done := make(chan struct{})
	f := newFakeCollector(t, true, func(conn int, c *fakeConn) {
		if conn <= failing {
			c.welcome(0)
			if _, err := c.read(); err != nil { // the batch it cannot write
				return
			}
			msg := websocket.FormatCloseMessage(websocket.CloseInternalServerErr, "cannot write the batch")
			_ = c.ws.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
			return
		}
		c.welcome(1) // well again: the batch is written
		if conn == failing+1 {
			close(done)
		}
		_, _ = c.read()
	})
	var out lockedBuffer
	cfg := testConfig(f.url)
	cfg.ReconnectMin, cfg.ReconnectMax = time.Millisecond, time.Second
	cfg.Logger = zerolog.New(&out)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, 0, 1)
	<-done
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	var waits []float64
	for _, line := range bytes.Split([]byte(out.String()), []byte("\n")) {
		var rec struct {
			Message string  `json:"message"`
			RetryMS float64 `json:"retry_in_ms"`
		}
		if json.Unmarshal(line, &rec) == nil && rec.Message == "log stream down, reconnecting after backoff" {
			waits = append(waits, rec.RetryMS)
		}
	}
	if len(waits) < failing {
		t.Fatalf("%d reconnect waits logged, want %d: %v", len(waits), failing, waits)
	}
	// The 8th consecutive failure waits 1ms * 2^7 = 128ms, ±50%.
	if last := waits[failing-1]; last < 64 {
		t.Fatalf("after %d failed sessions in a row the shipper waits %.1fms before the next (waits %v): no backoff", failing, last, waits)
	}
}
