package live

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMemStat(t *testing.T) {
	profile := "heap profile: 1: 2 [3: 4] @ heap/1048576\n# runtime.MemStats\n# Alloc = 123\n# HeapInuse = 4194304\n# Stack = 1 / 2\n"
	if v, err := memStat(strings.NewReader(profile), "HeapInuse"); err != nil || v != 4<<20 {
		t.Fatalf("HeapInuse = %d, %v", v, err)
	}
	if _, err := memStat(strings.NewReader("# Alloc = 1\n"), "HeapInuse"); err == nil {
		t.Fatal("a profile without the field must be an error")
	}
	if _, err := memStat(strings.NewReader("# HeapInuse = lots\n"), "HeapInuse"); err == nil {
		t.Fatal("a non-numeric value must be an error")
	}
}

func TestResidentBytes(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc")
	}
	rss, err := residentBytes(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Fatalf("RSS of this test = %d, %v", rss, err)
	}
}

func TestSoakFailures(t *testing.T) {
	ok := SoakResult{MaxGrowth: 0.1, HeapStart: 100, HeapEnd: 109, RSSStart: 100, RSSEnd: 95}
	if f := ok.Failures(); len(f) != 0 {
		t.Fatalf("flat run failed: %v", f)
	}
	bad := SoakResult{MaxGrowth: 0.1, Errors: 1, FirstError: "HTTP 503", HeapStart: 100, HeapEnd: 120, RSSStart: 100, RSSEnd: 100}
	if f := bad.Failures(); len(f) != 2 || !strings.Contains(f[0], "HTTP 503") || !strings.Contains(f[1], "heap") {
		t.Fatalf("failures %v", f)
	}
	// An agent lost during the soak changes what was measured, errors or not.
	ok.EarlyExits = []string{"bench-worker-1 exited by itself before it was stopped (signal: killed; its stderr: x)"}
	if f := ok.Failures(); len(f) != 1 || f[0] != ok.EarlyExits[0] {
		t.Fatalf("failures %v, want the early exit", f)
	}
}

// stuckDispatcher holds every /run-task until release is closed (answering 200) or the
// request's context ends; it reports the first request and the first cancellation.
type stuckDispatcher struct {
	started, cancelled, release        chan struct{}
	startOnce, cancelOnce, releaseOnce sync.Once
}

func (d *stuckDispatcher) answer() { d.releaseOnce.Do(func() { close(d.release) }) }

func newStuckDispatcher(t *testing.T) (*stuckDispatcher, *httptest.Server) {
	d := &stuckDispatcher{started: make(chan struct{}), cancelled: make(chan struct{}), release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read to the end: only then does the server watch the connection, and so
		// see the client go away.
		io.Copy(io.Discard, r.Body)
		d.startOnce.Do(func() { close(d.started) })
		select {
		case <-r.Context().Done():
			d.cancelOnce.Do(func() { close(d.cancelled) })
		case <-d.release:
			w.Write([]byte(`{"status":"completed"}`))
		}
	}))
	t.Cleanup(func() {
		d.answer()
		srv.Close()
	})
	return d, srv
}

// Ctrl-C during a soak (ctx cancelled) must reach the requests in flight: they were
// sent detached from it (context.WithoutCancel), so a stuck dispatcher, the reason
// to press Ctrl-C, held the soak for as long as it held its sync requests (the
// dispatcher's --task-timeout, 5 minutes, each).
func TestSoakInterruptEndsRequestsInFlight(t *testing.T) {
	t.Parallel()
	d, srv := newStuckDispatcher(t)
	l := &soakLoad{cfg: SoakConfig{Config: Config{Labels: 1}, Concurrency: 1}, client: srv.Client(), url: srv.URL + "/run-task"}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan []time.Duration)
	go func() { done <- l.openLoop(ctx, 1000, time.Hour) }()
	<-d.started
	cancel() // Ctrl-C
	// The timer only turns a hang into a failure; it synchronises nothing.
	watchdog := time.NewTimer(10 * time.Second)
	defer watchdog.Stop()
	select {
	case <-d.cancelled:
	case <-watchdog.C:
		t.Fatal("10s after Ctrl-C the soak request in flight is still held open")
	}
	select {
	case lat := <-done:
		if len(lat) != 0 || l.errors.Load() != 0 {
			t.Errorf("interrupted request: %d latencies, %d errors (%s); want neither", len(lat), l.errors.Load(), l.firstErr())
		}
	case <-watchdog.C:
		t.Fatal("10s after Ctrl-C openLoop has not returned")
	}
}

// The end of the run's duration stops the sending only: a task in flight then is
// answered and counted, not cut off and counted as an error.
func TestSoakEndAnswersRequestsInFlight(t *testing.T) {
	t.Parallel()
	d, srv := newStuckDispatcher(t)
	l := &soakLoad{cfg: SoakConfig{Config: Config{Labels: 1}, Concurrency: 1}, client: srv.Client(), url: srv.URL + "/run-task"}
	stopped := make(chan struct{})
	l.sendingStopped = func() { close(stopped) }
	done := make(chan []time.Duration)
	// Concurrency 1: the first request is held, so the loop waits for a slot until the
	// run ends (d is the run's length; nothing waits on it).
	go func() { done <- l.openLoop(t.Context(), 1000, 300*time.Millisecond) }()
	select {
	case <-d.started:
	case <-stopped:
		t.Fatal("the run ended before its first request was sent")
	}
	<-stopped
	d.answer() // only after the run's end
	lat := <-done
	if len(lat) != 1 || l.ok.Load() != 1 || l.errors.Load() != 0 {
		t.Errorf("%d latencies, %d ok, %d errors (%s); want the request in flight at the end answered", len(lat), l.ok.Load(), l.errors.Load(), l.firstErr())
	}
	select {
	case <-d.cancelled:
		t.Error("the request in flight at the end of the run was cancelled")
	default:
	}
}
