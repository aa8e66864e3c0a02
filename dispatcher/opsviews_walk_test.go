package dispatcher

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// getRaw fetches path and returns the status and the body as sent.
func (b *bundle) getRaw(path string) (int, string) {
	resp, err := b.client().Get(b.srv.URL + path)
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

func decode(t *testing.T, body string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("%v: %q", err, body)
	}
}

type rawAnswer struct {
	status int
	body   string
}

func (b *bundle) getRawAsync(path string) <-chan rawAnswer {
	ch := make(chan rawAnswer, 1)
	go func() {
		code, body := b.getRaw(path)
		ch <- rawAnswer{code, body}
	}()
	return ch
}

// recvWithin receives from ch, failing the test after 10 s (a failure bound, not
// synchronisation).
func recvWithin[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing within 10 s", what)
		panic("unreachable")
	}
}

// A fleet view lets go of the hub's lock between chunks of viewChunk workers: a task
// submitted while a walk of the detail view is paused between two chunks is routed,
// run and answered before the walk goes on. Reading the whole fleet in one hold left
// every task waiting for the walk (3–5 ms with 10,000 workers, and a few clients
// polling kept the lock held most of the time). The view itself is whole and sorted.
func TestFleetViewRoutesTasksBetweenChunks(t *testing.T) {
	t.Parallel()
	paused, resume := make(chan struct{}, 1), make(chan struct{})
	release := sync.OnceFunc(func() { close(resume) })
	var chunks atomic.Int32
	cfg := Config{}
	cfg.onViewChunk = func() {
		if chunks.Add(1) == 1 {
			paused <- struct{}{}
			<-resume
		}
	}
	b := setup(t, cfg)
	t.Cleanup(release) // a failed test must not leave the walk paused for the shutdown
	hot := b.dial("hot", "m-hot")
	n := 2*viewChunk + 1 // three chunks
	for i := range n - 1 {
		b.dial(fmt.Sprintf("w%03d", i), fmt.Sprintf("m%d", i%3))
	}
	view := b.getRawAsync("/workers?detail=true")
	recvWithin(t, "the walk's first chunk", paused)

	ans := b.postAsync(`{"task_id":"during-walk","task_type":"x","label":"m-hot"}`)
	a := hot.assignment()
	hot.finish(a, true, `{}`)
	if got := recvWithin(t, "the task's answer during the walk", ans); got.status != http.StatusOK || got.body["worker_id"] != "hot" {
		t.Fatalf("task during the walk: %d %v", got.status, got.body)
	}
	release()

	got := recvWithin(t, "the detail view", view)
	if got.status != http.StatusOK {
		t.Fatalf("/workers?detail=true: %d %s", got.status, got.body)
	}
	if c := chunks.Load(); c != 3 {
		t.Fatalf("%d workers read in %d chunks, want 3", n, c)
	}
	var det struct {
		Workers []workerDetail `json:"workers"`
	}
	decode(t, got.body, &det)
	ids := make([]string, len(det.Workers))
	for i, w := range det.Workers {
		ids[i] = w.ID
	}
	if len(ids) != n || !slices.IsSorted(ids) || ids[n-1] != "w255" {
		t.Fatalf("detail view lists %d workers (%q … %q), want %d sorted", len(ids), ids[0], ids[len(ids)-1], n)
	}
	if w := det.Workers[0]; w.ID != "hot" || fmt.Sprint(w.Labels) != "[m-hot]" || w.Running != 0 || !w.Accepting {
		t.Fatalf("hot's detail %+v", w)
	}
}

// Requests that come while a fleet walk runs share the next one: however many clients
// poll, one walk at a time takes turns with the routing for the hub's lock. The shared
// walk begins after they came, so a worker welcomed before a request is in its view,
// even when it joined during the walk before.
func TestFleetViewsShareTheNextWalk(t *testing.T) {
	t.Parallel()
	paused, resume := make(chan struct{}, 1), make(chan struct{})
	release := sync.OnceFunc(func() { close(resume) })
	var walks atomic.Int32 // one chunk per walk: the fleet is small
	cfg := Config{}
	cfg.onViewChunk = func() {
		if walks.Add(1) == 1 {
			paused <- struct{}{}
			<-resume
		}
	}
	b := setup(t, cfg)
	t.Cleanup(release)
	b.dial("w1", "a")
	first := b.getRawAsync("/labels")
	recvWithin(t, "the first walk", paused)
	b.dial("w2", "a", "b") // while the first walk is paused
	const k = 6
	var later []<-chan rawAnswer
	for i := range k {
		later = append(later, b.getRawAsync([]string{"/labels", "/workers?detail=true"}[i%2]))
	}
	waitFor(t, "the requests to wait for a walk", func() bool {
		b.d.hub.views.mu.Lock()
		defer b.d.hub.views.mu.Unlock()
		return b.d.hub.views.waiting == k
	})
	release()

	if got := recvWithin(t, "the first /labels", first); got.status != http.StatusOK || got.body != `{"a":["w1"]}`+"\n" {
		t.Fatalf("first /labels: %d %q", got.status, got.body)
	}
	for i, ch := range later {
		got := recvWithin(t, "a later view", ch)
		if got.status != http.StatusOK {
			t.Fatalf("later view %d: %d %s", i, got.status, got.body)
		}
		if i%2 == 0 {
			if got.body != `{"a":["w1","w2"],"b":["w2"]}`+"\n" {
				t.Fatalf("later /labels %q", got.body)
			}
			continue
		}
		var det struct {
			Workers []workerDetail `json:"workers"`
		}
		decode(t, got.body, &det)
		if len(det.Workers) != 2 || det.Workers[1].ID != "w2" || fmt.Sprint(slices.Sorted(slices.Values(det.Workers[1].Labels))) != "[a b]" {
			t.Fatalf("later detail view %s", got.body)
		}
	}
	if w := walks.Load(); w != 2 {
		t.Fatalf("%d walks for 1+%d requests, want 2 (the first, and one shared by the rest)", w, k)
	}
}
