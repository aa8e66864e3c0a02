package dispatcher

import (
	"net/http"
	"testing"
	"time"
)

// README, errors table: 503 "shutting down ... with Retry-After". A synchronous task
// still running when --shutdown-timeout runs out is answered 503 because the
// dispatcher is shutting down, and a producer should be told when to retry.
func TestShutdownTimeout503HasRetryAfter(t *testing.T) {
	t.Parallel()
	b, cancel, runErr := run(t, Config{ShutdownTimeout: 200 * time.Millisecond})
	w := b.dial("w1", "m")
	ans := b.postAsync(`{"task_id":"slow","task_type":"x","label":"m"}`)
	w.assignment() // runs, and never answers
	cancel()       // SIGTERM
	got := await(t, ans)
	if got.status != http.StatusServiceUnavailable {
		t.Fatalf("in-flight task at shutdown timeout: %d %v, want 503", got.status, got.body)
	}
	if got.header.Get("Retry-After") == "" {
		t.Errorf("503 %q at shutdown has no Retry-After header", got.body["error"])
	}
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
}

// The same for a producer waiting on a journaled task that shutdown lets go to the
// journal: the task was not answered, the producer is to retry after the restart.
func TestShutdownReleasedJournaledTask503HasRetryAfter(t *testing.T) {
	t.Parallel()
	waiting := make(chan string, 1)
	b := setup(t, Config{DataDir: t.TempDir(), TaskRetention: time.Hour, onWait: func(id string) { waiting <- id }})
	t.Cleanup(func() { b.d.Close() })
	if code, _ := b.post("/run-task", `{"task_id":"x","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
		t.Fatalf("async submit: %d", code)
	}
	ans := b.postAsync(`{"task_id":"x","task_type":"t","label":"m"}`)
	<-waiting
	<-b.d.hub.beginShutdown()
	got := await(t, ans)
	if got.status != http.StatusServiceUnavailable {
		t.Fatalf("waiting producer got %d %v, want 503", got.status, got.body)
	}
	if got.header.Get("Retry-After") == "" {
		t.Errorf("503 %q at shutdown has no Retry-After header", got.body["error"])
	}
}

// README: GET /tasks/{id} is 404 only "for an unknown or expired id". A journaled
// task that shutdown lets go to the journal is neither: it runs at the next start.
// While the dispatcher drains (handlers still served), a producer polling it is told
// the task does not exist.
func TestReleasedJournaledTaskIsShownDuringShutdown(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DataDir: t.TempDir(), TaskRetention: time.Hour})
	t.Cleanup(func() { b.d.Close() })
	if code, _ := b.post("/run-task", `{"task_id":"x","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
		t.Fatalf("async submit: %d", code)
	}
	<-b.d.hub.beginShutdown() // x is queued: let go to the journal
	if code, out := b.get("/tasks/x"); code != http.StatusOK || out["status"] != "queued" {
		t.Errorf("GET /tasks/x of a journaled task during shutdown: %d %v, want 200 queued", code, out)
	}
}
