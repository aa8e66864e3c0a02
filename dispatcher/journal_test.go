package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

// testClock is a clock the test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// setupJournaled is setup with a journal in dir; the journal is closed at cleanup
// unless the test closed it (a "crash": nothing else is shut down).
func setupJournaled(t *testing.T, dir string, clock *testClock) *bundle {
	t.Helper()
	b := setup(t, Config{DataDir: dir, Clock: clock, TaskRetention: time.Hour})
	t.Cleanup(func() { b.d.Close() })
	return b
}

// An asynchronous task outlives its dispatcher: the next one on the data dir runs it,
// keeps its answer across another restart, and answers a resubmission of its id from
// the journal without running it again.
func TestJournalRunsPendingTasksAfterRestart(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	first := setupJournaled(t, dir, clock)
	if code, out := first.post("/run-task", `{"task_id":"j-1","task_type":"t","label":"m","return_result":false}`); code != 202 || out["status"] != "queued" {
		t.Fatalf("async submit: %d %v", code, out)
	}
	if err := first.d.Close(); err != nil { // crash: no worker ever saw the task
		t.Fatal(err)
	}

	second := setupJournaled(t, dir, clock)
	if code, out := second.get("/tasks/j-1"); code != 200 || out["status"] != "queued" {
		t.Fatalf("after restart: %d %v", code, out)
	}
	w := second.dial("w1")
	a := w.assignment()
	if a.TaskId != "j-1" || a.Label != "m" {
		t.Fatalf("assignment %v", a)
	}
	w.finish(a, true, `{"answer":1}`)
	waitStatus(t, second, "j-1", "completed")
	if err := second.d.Close(); err != nil {
		t.Fatal(err)
	}

	third := setupJournaled(t, dir, clock)
	code, out := third.get("/tasks/j-1")
	if code != 200 || out["status"] != "completed" || fmt.Sprint(out["result"]) != "map[answer:1]" {
		t.Fatalf("answer after a second restart: %d %v", code, out)
	}
	w3 := third.dial("w3")
	// Synchronous and asynchronous resubmissions get the stored answer; no worker runs it.
	if code, out := third.post("/run-task", `{"task_id":"j-1","task_type":"t","label":"m"}`); code != 200 || out["status"] != "completed" {
		t.Fatalf("sync resubmission: %d %v", code, out)
	}
	if code, out := third.post("/run-task", `{"task_id":"j-1","task_type":"t","label":"m","return_result":false}`); code != 202 || out["status"] != "completed" {
		t.Fatalf("async resubmission: %d %v", code, out)
	}
	// The worker's next frame is the assignment of a new task, not j-1 again.
	third.post("/run-task", `{"task_id":"j-2","task_type":"t","label":"m","return_result":false}`)
	if a := w3.assignment(); a.TaskId != "j-2" {
		t.Fatalf("resubmitted task ran again: %v", a)
	}
}

func waitStatus(t *testing.T, b *bundle, id, status string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, out := b.get("/tasks/" + id); out["status"] == status {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s never became %s", id, status)
		}
		time.Sleep(time.Millisecond) // polling an observable state
	}
}

// A journaled task whose deadline passed while no dispatcher ran fails with 504 and is
// never assigned; answers older than the retention are forgotten and swept.
func TestJournalDeadlinesAndRetentionAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	first := setupJournaled(t, dir, clock)
	first.post("/run-task", `{"task_id":"late","task_type":"t","label":"m","return_result":false,"timeout_ms":1000}`)
	first.post("/run-task", `{"task_id":"keep","task_type":"t","label":"m","return_result":false,"timeout_ms":7200000}`)
	first.d.Close()

	clock.advance(2 * time.Second)
	second := setupJournaled(t, dir, clock)
	code, out := second.get("/tasks/late")
	if code != 200 || out["status"] != "failed" || !strings.Contains(fmt.Sprint(out["error"]), "deadline") {
		t.Fatalf("expired task: %d %v", code, out)
	}
	if code, out := second.post("/run-task", `{"task_id":"late","task_type":"t","label":"m"}`); code != http.StatusGatewayTimeout {
		t.Fatalf("resubmitted expired task: %d %v", code, out)
	}
	if got := testutil.ToFloat64(second.d.hub.met.failed.WithLabelValues("m", "deadline")); got != 1 {
		t.Errorf("tasks_failed_total{label=m,reason=deadline} = %v after a journaled task expired while down, want 1", got)
	}
	w := second.dial("w1")
	if a := w.assignment(); a.TaskId != "keep" {
		t.Fatalf("assignment %v", a)
	}
	second.d.Close()

	clock.advance(time.Hour) // past the retention of "late"'s answer
	third := setupJournaled(t, dir, clock)
	if code, _ := third.get("/tasks/late"); code != 404 {
		t.Fatalf("answer past the retention: %d", code)
	}
	n, err := third.d.hub.journal.sweep(clock.Now(), 10)
	if err != nil || n != 1 {
		t.Fatalf("sweep deleted %d (%v), want the one expired answer", n, err)
	}
	// "keep" is still pending: the journal still holds it.
	l, err := third.d.hub.journal.load(clock.Now(), 100, 1<<20)
	if err != nil || len(l.pending) != 1 || l.pending[0].ID != "keep" || len(l.answered) != 0 {
		t.Fatalf("journal after sweep: pending %v answered %v err %v", l.pending, l.answered, err)
	}
}

// answerInJournal writes, as accept and the answers' writer would, a pending record of
// each id and then its answer finished at finished (zero: left pending).
func answerInJournal(t testing.TB, j *journal, finished time.Time, ids ...string) {
	t.Helper()
	batch := make([]journalEntry, 0, len(ids))
	if err := j.db.Update(func(tx *bolt.Tx) error {
		for _, id := range ids {
			e := journalEntry{ID: id, Label: "m", TaskType: "t", Created: 1}
			v, err := encodeEntry(&e)
			if err != nil {
				return err
			}
			if err := tx.Bucket(tasksBucket).Put([]byte(id), v); err != nil {
				return err
			}
			e.Finished, e.Status, e.HTTPStatus = finished.UnixNano(), statusCompleted, 200
			batch = append(batch, e)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !finished.IsZero() {
		if err := j.writeAnswers(batch); err != nil {
			t.Fatal(err)
		}
	}
}

// journalKeys lists the keys of a journal's bucket.
func journalKeys(t *testing.T, j *journal, bucket []byte) (keys []string) {
	t.Helper()
	if err := j.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, _ []byte) error { keys = append(keys, string(k)); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}

// The janitor deletes every expired answer, limit per transaction, and nothing else:
// not pending tasks, not answers within the retention, not an id accepted anew after
// its answer expired. A sweep with nothing to do writes nothing.
func TestJournalSweepDeletesOnlyExpiredAnswers(t *testing.T) {
	clock := &testClock{now: time.Unix(1_000_000, 0)}
	j, err := openJournal(t.TempDir(), journalOptions{retention: time.Minute, lockTimeout: time.Second, log: zerolog.Nop(), now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	var old []string
	for i := range 15 {
		old = append(old, fmt.Sprintf("old-%02d", i))
	}
	answerInJournal(t, j, clock.Now(), old...)
	answerInJournal(t, j, clock.Now(), "reused")
	clock.advance(time.Minute)
	answerInJournal(t, j, time.Time{}, "pending-1", "pending-2")
	answerInJournal(t, j, clock.Now(), "fresh-1", "fresh-2")
	// reused's answer expired and the id was accepted anew: its index entry is stale.
	if _, created, err := j.accept(&journalEntry{ID: "reused", Label: "m", Created: 2}, clock.Now()); err != nil || !created {
		t.Fatalf("accept of an expired id: created %v, %v", created, err)
	}

	n, err := j.sweep(clock.Now(), 4)
	if err != nil || n != 15 {
		t.Fatalf("sweep deleted %d answers (%v), want the 15 expired ones", n, err)
	}
	if got, want := fmt.Sprint(journalKeys(t, j, tasksBucket)), "[fresh-1 fresh-2 pending-1 pending-2 reused]"; got != want {
		t.Errorf("journal after the sweep holds %s, want %s", got, want)
	}
	if got := len(journalKeys(t, j, answeredBucket)); got != 2 {
		t.Errorf("index after the sweep holds %d entries, want the 2 fresh answers'", got)
	}
	writes := func() int64 { st := j.db.Stats(); return st.TxStats.GetWrite() }
	before := writes()
	if n, err := j.sweep(clock.Now(), 4); n != 0 || err != nil || writes() != before {
		t.Errorf("a sweep with nothing to delete: %d deleted (%v), %d pages written", n, err, writes()-before)
	}
}

// Answers arriving faster than the janitor's limit per sweep are all deleted once
// expired. Before, the limit counted every record looked at, pending and recent ones
// too, with no catching up: above about limit answers per interval the journal grew
// for good. Scaled down: limit 100, 150 answers a second, retention 10 s.
func TestJournalSweepKeepsUpWithAnswers(t *testing.T) {
	const limit, rate, seconds = 100, 150, 120
	retention := 10 * time.Second
	clock := &testClock{now: time.Unix(1_000_000, 0)}
	j, err := openJournal(t.TempDir(), journalOptions{retention: retention, lockTimeout: time.Second, log: zerolog.Nop(), now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	j.db.NoSync = true // a test of counts, not of the disk
	ids := make([]string, rate)
	for s := range seconds {
		clock.advance(time.Second)
		for i := range ids {
			ids[i] = fmt.Sprintf("t-%04d-%03d", s, i)
		}
		answerInJournal(t, j, clock.Now(), ids...)
		if _, err := j.sweep(clock.Now(), limit); err != nil {
			t.Fatal(err)
		}
	}
	// Within the retention: the answers of the last 10 seconds.
	if got, want := len(journalKeys(t, j, tasksBucket)), rate*int(retention/time.Second); got != want {
		t.Errorf("journal holds %d answers after %d s at %d/s with a %v retention; want %d", got, seconds, rate, retention, want)
	}
}

// A journal written by a build without the index of answers still has its expired
// answers swept: the start indexes them.
func TestJournalWithoutIndexIsSwept(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Unix(1_000_000, 0)}
	opts := journalOptions{retention: time.Minute, lockTimeout: time.Second, log: zerolog.Nop(), now: clock.Now}
	j, err := openJournal(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	answerInJournal(t, j, clock.Now(), "a-1", "a-2")
	answerInJournal(t, j, time.Time{}, "p-1")
	if err := j.db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(answeredBucket) }); err != nil {
		t.Fatal(err)
	}
	j.close()

	clock.advance(time.Minute)
	j, err = openJournal(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	if _, err := j.load(clock.Now(), 100, 1<<20); err != nil {
		t.Fatal(err)
	}
	if n, err := j.sweep(clock.Now(), 10); n != 2 || err != nil {
		t.Errorf("sweep of an old journal deleted %d answers (%v), want 2", n, err)
	}
	if got := fmt.Sprint(journalKeys(t, j, tasksBucket)); got != "[p-1]" {
		t.Errorf("old journal after the sweep holds %s, want [p-1]", got)
	}
}

// A second dispatcher on a data dir in use fails at once with a clear error.
func TestJournalDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	d, err := New(Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, err = New(Config{DataDir: dir, JournalLockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, errDataDirInUse) || !strings.Contains(err.Error(), "--data-dir") {
		t.Fatalf("second dispatcher on one data dir: %v", err)
	}
}

// A synchronous producer whose connection broke retries with the same id: it attaches
// to the run in flight and gets its answer; the task ran once.
func TestSyncRetryAfterBrokenConnectionAttaches(t *testing.T) {
	b := setup(t, Config{})
	w := b.dial("w1")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/run-task",
		strings.NewReader(`{"task_id":"retry-1","task_type":"t","label":"m"}`))
	broken := make(chan error, 1)
	go func() {
		resp, err := b.client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		broken <- err
	}()
	a := w.assignment()
	cancel() // the producer's connection breaks while the task runs
	if err := <-broken; err == nil {
		t.Fatal("the cancelled request got an answer")
	}
	retry := b.postAsync(`{"task_id":"retry-1","task_type":"t","label":"m"}`)
	waitStatus(t, b, "retry-1", "running") // still the first run
	w.finish(a, true, `"done"`)
	got := <-retry
	if got.status != 200 || got.body["result"] != "done" || got.body["attempts"] != float64(1) {
		t.Fatalf("retry: %d %v", got.status, got.body)
	}
	// Retrying after the answer gets the stored answer, and no new assignment.
	if code, out := b.post("/run-task", `{"task_id":"retry-1","task_type":"t","label":"m"}`); code != 200 || out["result"] != "done" {
		t.Fatalf("retry after the answer: %d %v", code, out)
	}
	b.post("/run-task", `{"task_id":"other","task_type":"t","label":"m","return_result":false}`)
	if a := w.assignment(); a.TaskId != "other" {
		t.Fatalf("retried task ran again: %v", a)
	}
}

// BenchmarkAsyncSubmit measures POST /run-task with return_result false through the
// handler, with and without the journal: concurrent 202s share bbolt commits.
func BenchmarkAsyncSubmit(b *testing.B) {
	for _, journaled := range []bool{false, true} {
		b.Run(fmt.Sprintf("journal=%v", journaled), func(b *testing.B) {
			cfg := Config{MaxQueued: 1 << 30}
			if journaled {
				cfg.DataDir = b.TempDir()
			}
			d, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			h := d.Handler()
			var seq sync.Mutex
			n := 0
			b.ReportAllocs()
			b.SetParallelism(32) // many producers, as behind a load balancer
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					seq.Lock()
					n++
					id := n
					seq.Unlock()
					body := fmt.Sprintf(`{"task_id":"b-%d","task_type":"t","label":"m%d","return_result":false}`, id, id%50)
					rec := httptest.NewRecorder()
					req := httptest.NewRequest(http.MethodPost, "/run-task", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					h.ServeHTTP(rec, req)
					if rec.Code != http.StatusAccepted {
						b.Errorf("status %d: %s", rec.Code, rec.Body)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}

// FuzzDecodeJournalEntry: a journal record read from disk never panics the decoder,
// what it decodes survives a round trip unchanged, and createdAt finds the Created of
// every record the journal writes.
func FuzzDecodeJournalEntry(f *testing.F) {
	for _, e := range []journalEntry{
		{ID: "t1", Label: "m", TaskType: "x", Params: []byte(`{"a":1}`), Created: 1, Deadline: 2},
		{ID: "t2", Label: "m", Finished: 3, Status: statusCompleted, HTTPStatus: 200, Result: []byte(`{"r":[1,2]}`), Attempts: 2},
		{ID: "t3", Finished: 4, Status: statusFailed, HTTPStatus: 504, Error: "deadline"},
	} {
		v, err := encodeEntry(&e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(v)
	}
	f.Add([]byte{})
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x01{"))
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x00null"))
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x00" + `{"id":",\"created\":7,","label":"\",\"created\":8","created":-3,"result":{"x":{"a":1,"created":9}}}`))
	f.Fuzz(func(t *testing.T, v []byte) {
		e1, err := decodeEntry(v)
		if err != nil {
			return
		}
		_ = finishedAt(v)
		b1, err := encodeEntry(&e1)
		if err != nil {
			t.Fatalf("decoded entry does not encode: %v", err)
		}
		e2, err := decodeEntry(b1)
		if err != nil {
			t.Fatalf("encoded entry does not decode: %v", err)
		}
		b2, _ := encodeEntry(&e2)
		if !bytes.Equal(b1, b2) || finishedAt(b1) != e1.Finished {
			t.Fatalf("round trip changed the record:\n%q\n%q", b1, b2)
		}
		if got := createdAt(b1); got != e1.Created {
			t.Fatalf("createdAt of %q = %d, want %d", b1, got, e1.Created)
		}
	})
}

// Shutdown does not wait for queued journaled tasks: they stay in the journal and the
// next start runs them.
func TestShutdownLeavesQueuedJournaledTasks(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	first := setupJournaled(t, dir, clock)
	first.post("/run-task", `{"task_id":"q-1","task_type":"t","label":"m","return_result":false}`)
	select {
	case <-first.d.hub.beginShutdown():
	case <-time.After(10 * time.Second):
		t.Fatal("shutdown waits for a queued journaled task")
	}
	first.d.Close()
	second := setupJournaled(t, dir, clock)
	if code, out := second.get("/tasks/q-1"); code != 200 || out["status"] != "queued" {
		t.Fatalf("after restart: %d %v", code, out)
	}
}

// Recovered tasks run in the order they were accepted, not in the journal's key order.
func TestJournalRecoversInAcceptOrder(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	first := setupJournaled(t, dir, clock)
	first.post("/run-task", `{"task_id":"z-first","task_type":"t","label":"m","return_result":false}`)
	clock.advance(time.Millisecond)
	first.post("/run-task", `{"task_id":"a-second","task_type":"t","label":"m","return_result":false}`)
	first.d.Close()
	second := setupJournaled(t, dir, clock)
	w := second.dial("w1")
	if a := w.assignment(); a.TaskId != "z-first" {
		t.Fatalf("first recovered assignment %s, want z-first", a.TaskId)
	}
}

// A synchronous producer waiting on a journaled task that shutdown leaves to the next
// start gets a 503 saying so, not silence until its connection is cut.
func TestShutdownAnswersAProducerWaitingOnAJournaledTask(t *testing.T) {
	waiting := make(chan string, 1)
	b := setup(t, Config{DataDir: t.TempDir(), TaskRetention: time.Hour, onWait: func(id string) { waiting <- id }})
	t.Cleanup(func() { b.d.Close() })
	if code, _ := b.post("/run-task", `{"task_id":"x","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
		t.Fatalf("async submit: %d", code)
	}
	ans := b.postAsync(`{"task_id":"x","task_type":"t","label":"m"}`) // attaches to the queued run
	if id := <-waiting; id != "x" {
		t.Fatalf("waiting on %q", id)
	}
	<-b.d.hub.beginShutdown()
	var a answer
	select {
	case a = <-ans:
	case <-time.After(10 * time.Second): // a failure bound, not synchronisation
		t.Fatal("the waiting producer got no answer after shutdown released its task")
	}
	if a.status != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(a.body["error"]), "journaled") {
		t.Fatalf("waiting producer got %d %v, want 503 saying the task stays journaled", a.status, a.body)
	}
}

// Memory keeps at most TaskRetentionCount answers, synchronous ones included; an
// asynchronous task's answer pushed out of memory early is still in the journal, so
// GET /tasks/{id} finds it and a synchronous resubmission does not run it again.
func TestJournaledAnswerBeyondTheCountBound(t *testing.T) {
	clock := &testClock{now: time.Now()}
	b := setup(t, Config{DataDir: t.TempDir(), Clock: clock, TaskRetention: time.Hour, TaskRetentionCount: 2})
	t.Cleanup(func() { b.d.Close() })
	w := b.dial("w1", "m")
	if code, _ := b.post("/run-task", `{"task_id":"async-1","task_type":"t","label":"m","return_result":false}`); code != 202 {
		t.Fatalf("async submit %d", code)
	}
	w.finish(w.assignment(), true, `{"v":1}`)
	waitStatus(t, b, "async-1", "completed")
	for i := range 2 { // push async-1 out of memory
		ans := b.postAsync(fmt.Sprintf(`{"task_id":"sync-%d","task_type":"t","label":"m"}`, i))
		w.finish(w.assignment(), true, `{}`)
		if got := <-ans; got.status != 200 {
			t.Fatalf("sync %d: %v", i, got)
		}
	}
	if code, out := b.get("/tasks/async-1"); code != 200 || out["status"] != "completed" {
		t.Errorf("GET /tasks/async-1 within the retention, its answer in the journal: %d %v", code, out)
	}
	ans := b.postAsync(`{"task_id":"async-1","task_type":"t","label":"m"}`)
	// The worker's next frame is a new task's assignment, not async-1 run again.
	b.post("/run-task", `{"task_id":"next","task_type":"t","label":"m","return_result":false}`)
	if a := w.assignment(); a.TaskId != "next" {
		t.Fatalf("the synchronous resubmission ran the task again: %v", a)
	}
	if got := <-ans; got.status != 200 || got.body["status"] != "completed" {
		t.Errorf("sync resubmission: %v", got)
	}
}

// An asynchronous task refused for a full queue writes nothing to the journal: when
// the dispatcher is overloaded, refusals must not cost synced commits.
func TestRefusedAsyncSubmitWritesNoJournal(t *testing.T) {
	b := setup(t, Config{DataDir: t.TempDir(), Clock: &testClock{now: time.Now()}, TaskRetention: time.Hour, MaxQueued: 1})
	t.Cleanup(func() { b.d.Close() })
	if code, _ := b.post("/run-task", `{"task_type":"t","label":"m","return_result":false}`); code != 202 {
		t.Fatal(code)
	}
	db := b.d.hub.journal.db
	writes := func() int64 { st := db.Stats(); return st.TxStats.GetWrite() }
	before := writes()
	for range 20 {
		if code, _ := b.post("/run-task", `{"task_type":"t","label":"m","return_result":false}`); code != 429 {
			t.Fatalf("want 429, got %d", code)
		}
	}
	if after := writes(); after != before {
		t.Errorf("20 refused (429) async submissions wrote %d pages to the journal", after-before)
	}
}

// TestOpenJournalChild opens a dispatcher on JOURNAL_CHILD_DIR as cmd/dispatcher
// does; TestDamagedJournalIsAnError runs it in a child process, since the failure it
// guards against is a panic in a goroutine of bbolt's that would end the test binary.
func TestOpenJournalChild(t *testing.T) {
	dir := os.Getenv("JOURNAL_CHILD_DIR")
	if dir == "" {
		t.Skip("run by TestDamagedJournalIsAnError")
	}
	d, err := New(Config{DataDir: dir, TaskRetention: time.Hour})
	fmt.Printf("New: %v\n", err)
	if d != nil {
		d.Close()
	}
}

// openJournalChild runs TestOpenJournalChild on dir with env added, and returns what it
// printed.
func openJournalChild(t *testing.T, dir string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenJournalChild$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), "JOURNAL_CHILD_DIR="+dir), env...)
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// crashed says whether a child's output shows a panic or a fault that ended it.
func crashed(out string) bool {
	return strings.Contains(out, "\npanic: ") || strings.HasPrefix(out, "panic: ") || strings.Contains(out, "fatal error:") ||
		strings.Contains(out, "unexpected fault address")
}

// A damaged journal (cut short, a page overwritten, a key out of order) is an error
// from New that says what to do, not a crash on every start. A key out of order reads
// through but fails bbolt's check: the read-write open's free-list rebuild panicked on
// it in a goroutine of bbolt's, on every start.
func TestDamagedJournalIsAnError(t *testing.T) {
	for _, damage := range []string{"truncated", "overwritten", "key out of order"} {
		dir := damagedJournal(t, damage)
		if out := openJournalChild(t, dir); !strings.Contains(out, "is damaged") || crashed(out) {
			t.Errorf("%s journal: want New to say it is damaged, got:\n%s", damage, out)
		}
	}
}

// damagedJournal writes a journal of 300 pending tasks (c-0 to c-299) in a new dir and
// damages it.
func damagedJournal(t *testing.T, damage string) (dir string) {
	t.Helper()
	dir = t.TempDir()
	b := setup(t, Config{DataDir: dir, Clock: &testClock{now: time.Now()}, TaskRetention: time.Hour})
	for i := range 300 {
		if code, _ := b.post("/run-task", fmt.Sprintf(`{"task_id":"c-%d","task_type":"t","label":"m","return_result":false,"parameters_json":{"pad":"%0200d"}}`, i, i)); code != 202 {
			t.Fatalf("submit %d", code)
		}
	}
	if err := b.d.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, journalFile)
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	switch damage {
	case "truncated":
		raw = raw[:len(raw)/2]
	case "overwritten":
		for i := 3 * 4096; i < 5*4096 && i < len(raw); i++ {
			raw[i] = 0xA5
		}
	case "key out of order":
		// The key c-150 in its leaf page (its value's 8-byte zero prefix follows it)
		// becomes c-000: it now sorts before its neighbours.
		i := bytes.Index(raw, append([]byte("c-150"), make([]byte, 8)...))
		if i < 0 {
			t.Fatal("key c-150 not found in the file")
		}
		copy(raw[i:], "c-000")
	}
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A file that is not a journal at all (another file put in its place, or one too short
// to hold bbolt's header) gets the same advice, not bbolt's bare "invalid database".
func TestJournalThatIsNotOneSaysWhatToDo(t *testing.T) {
	for name, raw := range map[string][]byte{
		"random": bytes.Repeat([]byte("not a journal "), 32<<10/14),
		"short":  bytes.Repeat([]byte{0xA5}, 4096),
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, journalFile), raw, 0o600); err != nil {
			t.Fatal(err)
		}
		if out := openJournalChild(t, dir); !strings.Contains(out, "is damaged") || !strings.Contains(out, "move it aside") {
			t.Errorf("%s file as the journal: want New to say it is damaged and what to do, got:\n%s", name, out)
		}
	}
}

// An unreadable record (say, written by a build with another format) does not stop the
// start, is deleted, and its id can be used again: before, every submission under it
// answered 500 for good.
func TestUnreadableJournalRecordIsDroppedAndItsIDUsable(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	first := setupJournaled(t, dir, clock)
	for _, id := range []string{"bad-1", "bad-2"} {
		if code, _ := first.post("/run-task", `{"task_id":"`+id+`","task_type":"t","label":"m","return_result":false}`); code != 202 {
			t.Fatalf("submit %s: %d", id, code)
		}
	}
	// bad-1's record is damaged before the next start (load meets it), bad-2's after
	// (a resubmission's accept meets it).
	damage := func(j *journal, id string) {
		t.Helper()
		if err := j.db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(tasksBucket).Put([]byte(id), append(make([]byte, 8), "{not json"...))
		}); err != nil {
			t.Fatal(err)
		}
	}
	damage(first.d.hub.journal, "bad-1")
	if err := first.d.Close(); err != nil {
		t.Fatal(err)
	}
	second := setupJournaled(t, dir, clock)
	if code, _ := second.get("/tasks/bad-1"); code != 404 {
		t.Errorf("GET /tasks/bad-1 after its record was found unreadable: %d, want 404", code)
	}
	if code, out := second.post("/run-task", `{"task_id":"bad-1","task_type":"t","label":"m","return_result":false}`); code != 202 {
		t.Errorf("bad-1 submitted again: %d %v", code, out)
	}
	damage(second.d.hub.journal, "bad-2") // in flight here: the resubmission meets the record
	if code, out := second.post("/run-task", `{"task_id":"bad-2","task_type":"t","label":"m","return_result":false}`); code != 202 {
		t.Errorf("bad-2, its record unreadable, submitted again: %d %v", code, out)
	}
}

// A write of answers that fails (a full disk) loses nothing: the answers stay
// answerable from memory, are counted and shown as unwritten, and are written once the
// disk takes them again, so that after a restart the task reads as completed and does
// not run again. Before, the failed batch was dropped: the task ran a second time
// after the restart.
func TestJournalAnswerWriteFailureIsRetried(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	var failing sync.Mutex // held while the disk is "full"
	diskFull := errors.New("no space left on device")
	tried := make(chan error, 1000) // the result of each write of answers
	cfg := Config{DataDir: dir, Clock: clock, TaskRetention: time.Hour,
		journalRetry: func() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) },
		journalWriteFault: func() error {
			var err error
			if !failing.TryLock() {
				err = diskFull
			} else {
				failing.Unlock()
			}
			select {
			case tried <- err:
			default:
			}
			return err
		}}
	first := setup(t, cfg)
	t.Cleanup(func() { first.d.Close() })
	w := first.dial("w1", "m")
	if code, out := first.post("/run-task", `{"task_id":"big","task_type":"t","label":"m","return_result":false}`); code != 202 {
		t.Fatalf("submit: %d %v", code, out)
	}
	a := w.assignment()
	for len(tried) > 0 {
		<-tried // the submission's write
	}
	failing.Lock()
	w.finish(a, true, `{"answer":1}`)
	for i := range 2 { // the first failure and one retry
		select {
		case err := <-tried:
			if !errors.Is(err, diskFull) {
				t.Fatalf("write while the disk is full: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d writes of the answer while the disk is full, want a retry", i)
		}
	}
	if code, out := first.get("/tasks/big"); code != 200 || out["status"] != "completed" {
		t.Fatalf("while unwritten: %d %v", code, out)
	}
	if n := first.d.hub.journal.unwritten(); n != 1 {
		t.Errorf("unwritten answers: %d, want 1", n)
	}
	// The first failure is counted before the retry is made (the retry's own count may
	// still be on its way).
	if got := testutil.ToFloat64(first.d.hub.met.journalWriteErrors); got < 1 {
		t.Errorf("journal_write_errors_total %v, want at least 1", got)
	}
	failing.Unlock() // room again
	for deadline := time.Now().Add(10 * time.Second); first.d.hub.journal.unwritten() != 0; {
		if time.Now().After(deadline) {
			t.Fatal("the answer was never written once the disk took it")
		}
		time.Sleep(time.Millisecond) // polling an observable state
	}
	if err := first.d.Close(); err != nil { // crash
		t.Fatal(err)
	}

	second := setupJournaled(t, dir, clock)
	if code, out := second.get("/tasks/big"); code != 200 || out["status"] != "completed" || fmt.Sprint(out["result"]) != "map[answer:1]" {
		t.Fatalf("after restart: %d %v", code, out)
	}
	w2 := second.dial("w2", "m")
	second.post("/run-task", `{"task_id":"next","task_type":"t","label":"m","return_result":false}`)
	if a := w2.assignment(); a.TaskId != "next" {
		t.Fatalf("the answered task ran again: %v", a)
	}
}

// A journal whose writes keep failing still closes: what it could not write is lost
// as in a crash, and the task runs again at the next start.
func TestJournalCloseWithAFailingDiskReturns(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	var failing atomic.Bool
	first := setup(t, Config{DataDir: dir, Clock: clock, TaskRetention: time.Hour,
		journalRetry: func() backoff.BackOff { return backoff.NewConstantBackOff(time.Hour) },
		journalWriteFault: func() error {
			if failing.Load() {
				return errors.New("input/output error")
			}
			return nil
		}})
	t.Cleanup(func() { first.d.Close() })
	w := first.dial("w1", "m")
	if code, out := first.post("/run-task", `{"task_id":"lost","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
		t.Fatalf("submit: %d %v", code, out)
	}
	failing.Store(true)
	w.finish(w.assignment(), true, `{"answer":1}`)
	waitStatus(t, first, "lost", "completed")
	if err := first.d.Close(); err != nil {
		t.Fatal(err)
	}
	second := setupJournaled(t, dir, clock)
	if code, out := second.get("/tasks/lost"); code != 200 || out["status"] != "queued" {
		t.Fatalf("after restart: %d %v, want queued (run again)", code, out)
	}
}

// An asynchronous task the journal cannot take (a full disk) is refused with 503 and
// Retry-After, so that producers retry, and leaves nothing behind: the same id is
// accepted once the disk takes it.
func TestJournalAcceptFailureIs503(t *testing.T) {
	t.Parallel()
	var full atomic.Bool
	full.Store(true)
	b := setup(t, Config{DataDir: t.TempDir(), TaskRetention: time.Hour,
		journalWriteFault: func() error {
			if full.Load() {
				return errors.New("no space left on device")
			}
			return nil
		}})
	t.Cleanup(func() { b.d.Close() })
	body := `{"task_id":"a1","task_type":"t","label":"m","return_result":false}`
	code, hdr, out := b.send("POST", "/run-task", body)
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" || !strings.Contains(fmt.Sprint(out["error"]), "journal write failed") {
		t.Fatalf("submit on a full disk: %d Retry-After %q %v", code, hdr.Get("Retry-After"), out)
	}
	if code, _ := b.get("/tasks/a1"); code != http.StatusNotFound {
		t.Fatalf("GET after the refusal: %d, want 404", code)
	}
	full.Store(false)
	if code, out := b.post("/run-task", body); code != http.StatusAccepted || out["status"] != "queued" {
		t.Fatalf("submit once the disk takes it: %d %v", code, out)
	}
}

// An asynchronous task whose answer is still waiting for the disk (the journal's
// writer is backing off after a failed write) and has been pushed out of memory by the
// count bound must not run again when its id is resubmitted asynchronously: GET
// /tasks/{id} finds the answer, and so must the resubmission ("the task runs once").
func TestAsyncResubmitOfAnUnwrittenAnswerDoesNotRunItAgain(t *testing.T) {
	t.Parallel()
	clock := &testClock{now: time.Now()}
	var full atomic.Bool
	diskFull := errors.New("no space left on device")
	failed := make(chan struct{}, 100)
	b := setup(t, Config{DataDir: t.TempDir(), Clock: clock, TaskRetention: time.Hour, TaskRetentionCount: 1,
		// The writer waits an hour before trying the failed answer again.
		journalRetry: func() backoff.BackOff { return backoff.NewConstantBackOff(time.Hour) },
		journalWriteFault: func() error {
			if full.Load() {
				select {
				case failed <- struct{}{}:
				default:
				}
				return diskFull
			}
			return nil
		}})
	t.Cleanup(func() { b.d.Close() })
	w := b.dial("w1", "m")
	if code, out := b.post("/run-task", `{"task_id":"x","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
		t.Fatalf("async submit: %d %v", code, out)
	}
	a := w.assignment()
	full.Store(true)
	w.finish(a, true, `{"answer":1}`)
	select {
	case <-failed: // the answer's write failed; the next try is an hour away
	case <-time.After(10 * time.Second): // a failure bound, not synchronisation
		t.Fatal("the answer's write was never tried")
	}
	full.Store(false) // room again for new tasks' records
	// Push x's answer out of memory (count bound 1) with one synchronous task.
	ans := b.postAsync(`{"task_id":"s","task_type":"t","label":"m"}`)
	w.finish(w.assignment(), true, `{}`)
	if got := <-ans; got.status != http.StatusOK {
		t.Fatalf("sync task: %v", got)
	}
	if code, out := b.get("/tasks/x"); code != http.StatusOK || out["status"] != "completed" {
		t.Fatalf("GET /tasks/x with its answer unwritten: %d %v", code, out)
	}
	code, out := b.post("/run-task", `{"task_id":"x","task_type":"t","label":"m","return_result":false}`)
	if code != http.StatusAccepted || out["status"] != "completed" {
		t.Errorf("async resubmission of answered x: %d %v, want 202 completed (the stored answer)", code, out)
	}
	b.post("/run-task", `{"task_id":"next","task_type":"t","label":"m","return_result":false}`)
	if a := w.assignment(); a.TaskId != "next" {
		t.Fatalf("answered task ran again: worker was sent %s attempt %d, want next", a.TaskId, a.Attempt)
	}
}

// An answer held back by a failing disk past the retention must not be written over a
// resubmission of its id accepted meanwhile (allowed: the id expired). Before, the
// accept found the old run's record still pending and wrote nothing, and the late
// answer then turned it into an expired answer: after a crash the task accepted with
// 202 was neither run nor known (404).
func TestDelayedAnswerDoesNotOverwriteAResubmission(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	var full atomic.Bool
	failed := make(chan struct{}, 1)
	cfg := Config{DataDir: dir, Clock: clock, TaskRetention: time.Hour,
		journalRetry: func() backoff.BackOff { return backoff.NewConstantBackOff(time.Hour) }, // written again at close only
		journalWriteFault: func() error {
			if !full.Load() {
				return nil
			}
			select {
			case failed <- struct{}{}:
			default:
			}
			return errors.New("no space left on device")
		}}
	first := setup(t, cfg)
	t.Cleanup(func() { first.d.Close() })
	w := first.dial("w1", "m")
	body := `{"task_id":"x","task_type":"t","label":"m","return_result":false,"timeout_ms":86400000}`
	if code, out := first.post("/run-task", body); code != http.StatusAccepted {
		t.Fatalf("submit: %d %v", code, out)
	}
	a := w.assignment()
	full.Store(true)
	w.finish(a, true, `{"answer":1}`)
	<-failed // the answer waits for the disk
	full.Store(false)
	clock.advance(time.Hour + time.Second) // x's answer expired: its id may be used again

	if code, out := first.post("/run-task", body); code != http.StatusAccepted {
		t.Fatalf("resubmission after the retention: %d %v", code, out)
	}
	if a2 := w.assignment(); a2.TaskId != "x" {
		t.Fatalf("the resubmission did not run: %v", a2)
	}
	// The writer tries the old answer again at close; then the "crash".
	if err := first.d.Close(); err != nil {
		t.Fatal(err)
	}
	second := setupJournaled(t, dir, clock)
	if code, out := second.get("/tasks/x"); code != http.StatusOK || out["status"] != "queued" {
		t.Errorf("after a restart GET /tasks/x = %d %v; want the resubmission, accepted with 202, queued", code, out)
	}
}

// The answers' writer replaces only its own run's pending record (the same Created),
// and writes no answer whose retention is over: it deletes its run's record instead.
func TestJournalAnswerWritesOnlyOverItsOwnRun(t *testing.T) {
	clock := &testClock{now: time.Now()}
	j, err := openJournal(t.TempDir(), journalOptions{retention: time.Minute, lockTimeout: time.Second, log: zerolog.Nop(), now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	created := clock.Now().UnixNano()
	for _, id := range []string{"own", "other", "expired"} {
		if _, _, err := j.accept(&journalEntry{ID: id, Label: "m", Created: created}, clock.Now()); err != nil {
			t.Fatal(err)
		}
	}
	answer := func(id string, created int64, finished time.Time) journalEntry {
		return journalEntry{ID: id, Label: "m", Created: created, Finished: finished.UnixNano(), Status: statusCompleted, HTTPStatus: 200}
	}
	if err := j.writeAnswers([]journalEntry{
		answer("own", created, clock.Now()),
		answer("other", created-1, clock.Now()), // an earlier run of the id
		answer("expired", created, clock.Now().Add(-time.Minute)),
		answer("none", created, clock.Now()), // no record: nothing accepted it
	}); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{} // id: finish time
	if err := j.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(tasksBucket).ForEach(func(k, v []byte) error { got[string(k)] = finishedAt(v); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"own": clock.Now().UnixNano(), "other": 0}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("journal after the answers (id: finish time): %v, want %v", got, want)
	}
}

// At start only the newest answers that fit --task-retention-bytes (and the count) are
// read into memory, one at a time; the older ones stay on disk, and GET /tasks/{id}
// reads them there. Before, every answer within the retention was decoded into one
// slice first: a journal larger than the memory allowed made every start run out of
// it until the answers expired. Scaled down: 12 answers of 256 KiB, a 1 MiB bound.
func TestStartReadsJournalAnswersWithinTheByteBound(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Unix(1_000_000, 0)}
	j, err := openJournal(dir, journalOptions{retention: time.Hour, lockTimeout: time.Second, log: zerolog.Nop(), now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	result := json.RawMessage(`"` + strings.Repeat("r", 256<<10) + `"`)
	var answers []journalEntry
	for i := range 12 {
		id := fmt.Sprintf("a-%02d", i)
		answerInJournal(t, j, time.Time{}, id)
		answers = append(answers, journalEntry{ID: id, Label: "m", TaskType: "t", Created: 1, Status: statusCompleted, HTTPStatus: 200,
			Result: result, Finished: clock.Now().Add(time.Duration(i) * time.Second).UnixNano()})
	}
	if err := j.writeAnswers(answers); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Minute)

	const bound = 1 << 20 // three answers
	l, err := j.load(clock.Now(), 100, bound)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	var size int64
	for _, e := range l.answered {
		ids = append(ids, e.ID)
		size += entryBytes(&e)
		if entryBytes(&e) != retainedBytes(recordFromEntry(e)) {
			t.Fatalf("entryBytes %d, retainedBytes %d: the bound at start is not the bound in memory", entryBytes(&e), retainedBytes(recordFromEntry(e)))
		}
	}
	if got := fmt.Sprint(ids); got != "[a-11 a-10 a-09]" || size > bound || l.droppedAt != answers[8].Finished {
		t.Errorf("load with a %d-byte bound read %s (%d bytes, dropped up to %d); want [a-11 a-10 a-09] and a-08's finish time", bound, got, size, l.droppedAt)
	}
	j.close()

	b := setup(t, Config{DataDir: dir, Clock: clock, TaskRetention: time.Hour, TaskRetentionBytes: bound})
	t.Cleanup(func() { b.d.Close() })
	if n := b.d.hub.finished.len(); n != 3 {
		t.Errorf("memory holds %d answers after the start, want 3", n)
	}
	if code, out := b.get("/tasks/a-00"); code != http.StatusOK || out["status"] != "completed" || len(fmt.Sprint(out["result"])) != 256<<10 {
		t.Errorf("GET /tasks/a-00, an answer left on disk at start: %d %v", code, out["status"])
	}
}

// --max-attempts bounds a task that takes the dispatcher down with it: each dispatcher
// that dies holding a journaled task charges it one start, and one that has used them
// up fails with 503 at the next start instead of running again. Before, every restart
// started its count afresh, so such a task crashed the dispatcher for good.
func TestJournalChargesAStartPerDispatcherThatDied(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	cfg := Config{DataDir: dir, Clock: clock, TaskRetention: time.Hour, Scheduler: scheduler.Config{MaxAttempts: 2}}
	first := setup(t, cfg)
	t.Cleanup(func() { first.d.Close() })
	w1 := first.dial("w1", "m")
	if code, out := first.post("/run-task", `{"task_id":"x","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
		t.Fatalf("submit: %d %v", code, out)
	}
	if a := w1.assignment(); a.TaskId != "x" || a.Attempt != 1 {
		t.Fatalf("first start: %v", a)
	}
	if err := first.d.Close(); err != nil { // the dispatcher dies while x runs
		t.Fatal(err)
	}

	second := setup(t, cfg)
	t.Cleanup(func() { second.d.Close() })
	if a := second.dial("w2", "m").assignment(); a.TaskId != "x" || a.Attempt != 2 {
		t.Fatalf("after one crash x started as %v, want attempt 2", a)
	}
	if err := second.d.Close(); err != nil { // and again
		t.Fatal(err)
	}

	third := setup(t, cfg)
	t.Cleanup(func() { third.d.Close() })
	code, out := third.get("/tasks/x")
	if code != http.StatusOK || out["status"] != "failed" || out["attempts"] != float64(2) || !strings.Contains(fmt.Sprint(out["error"]), "--max-attempts 2") {
		t.Fatalf("x after two crashes with --max-attempts 2: %d %v, want failed after 2 attempts", code, out)
	}
	if code, out := third.post("/run-task", `{"task_id":"x","task_type":"t","label":"m"}`); code != http.StatusServiceUnavailable {
		t.Errorf("resubmission of x: %d %v, want its 503", code, out)
	}
}

// A graceful shutdown writes how many times the tasks it leaves in the journal were
// started, so that restarts (a rolling update) do not use up a queued task's attempts.
func TestGracefulRestartsDoNotChargeQueuedTasks(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	cfg := Config{DataDir: dir, Clock: clock, TaskRetention: time.Hour, Scheduler: scheduler.Config{MaxAttempts: 2}}
	for i := range 3 {
		b, cancel, runErr := run(t, cfg)
		if i == 0 {
			if code, out := b.post("/run-task", `{"task_id":"x","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
				t.Fatalf("submit: %d %v", code, out)
			}
		}
		cancel() // SIGTERM: x, queued, is let go to the journal
		if err := <-runErr; err != nil {
			t.Fatalf("shutdown %d: %v", i, err)
		}
	}
	b := setupJournaled(t, dir, clock)
	if a := b.dial("w1", "m").assignment(); a.TaskId != "x" || a.Attempt != 1 {
		t.Fatalf("after three graceful restarts x started as %v, want attempt 1", a)
	}
}

// A submission whose deadline passes during its journal write is never run: the
// producer gets 504 at once (not 202 for a task that will never run), and the journal
// record is deleted, as for any refusal at admission, so a restart does not run it
// either.
func TestSubmissionPastItsDeadlineAtAdmissionAnswers504(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Now()}
	cfg := Config{DataDir: dir, Clock: clock, TaskRetention: time.Hour}
	cfg.onJournalAccept = func(taskID string, created bool) {
		if taskID == "late" {
			clock.advance(2 * time.Second) // a journal write slower than the timeout
		}
	}
	b := setup(t, cfg)
	w := b.dial("w1", "m")
	const late = `{"task_id":"late","task_type":"t","label":"m","return_result":false,"timeout_ms":1000}`
	if code, out := b.post("/run-task", late); code != http.StatusGatewayTimeout {
		t.Fatalf("late submission: %d %v, want 504", code, out)
	}
	if code, out := b.post("/run-task", `{"task_id":"next","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
		t.Fatalf("next submission: %d %v", code, out)
	}
	if got := w.assignment(); got.TaskId != "next" {
		t.Fatalf("worker got %s, want next: the late task must not run", got.TaskId)
	}
	if err := b.d.Close(); err != nil {
		t.Fatal(err)
	}
	// Refused as it was admitted, it left no record in the journal to run, nor an
	// answer that would keep its id from being used again.
	after := setupJournaled(t, dir, clock)
	if code, out := after.get("/tasks/late"); code != http.StatusNotFound {
		t.Fatalf("late task after a restart: %d %v, want it unknown (never accepted)", code, out)
	}
}
