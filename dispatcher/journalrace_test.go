package dispatcher

import (
	"net/http"
	"testing"
	"time"
)

// stop is a submission held at a journal hook until the test lets it go.
type stop struct {
	step    string // "accept" or "forget"
	created bool
	release chan struct{}
}

// holdJournal sets hooks that hold every submission of id at its journal write and
// before a refused one deletes its record, until free is closed.
func holdJournal(cfg *Config, id string, free <-chan struct{}) <-chan stop {
	stops := make(chan stop)
	hold := func(step string, created bool) {
		select {
		case <-free:
			return
		default:
		}
		s := stop{step, created, make(chan struct{})}
		stops <- s
		<-s.release
	}
	cfg.onJournalAccept = func(taskID string, created bool) {
		if taskID == id {
			hold("accept", created)
		}
	}
	cfg.onJournalForget = func(taskID string) {
		if taskID == id {
			hold("forget", false)
		}
	}
	return stops
}

func nextStop(t *testing.T, stops <-chan stop, step string, created bool) stop {
	t.Helper()
	select {
	case s := <-stops:
		if s.step != step || s.created != created {
			t.Fatalf("submission held at %s (created %v), want %s (created %v)", s.step, s.created, step, created)
		}
		return s
	case <-time.After(10 * time.Second): // a failure bound, not synchronisation
		t.Fatalf("no submission reached %s", step)
	}
	return stop{}
}

func answerWithin(t *testing.T, what string, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer", what)
	}
	return answer{}
}

// Two asynchronous submissions of one id at the queue bound: the first writes the
// journal record, the second finds it pending and relies on it. The first is refused
// (429) and the second accepted (202), and the first's delete of its record must not
// take the record the second was accepted on. Both orders of the second's admission
// and the first's delete are built: before the delete (the delete is called off) and
// after it (the second writes the record again).
func TestRefusedAsyncSubmissionKeepsAConcurrentAcceptedRecord(t *testing.T) {
	for _, tc := range []struct {
		name string
		// admitFirst: the second submission is admitted before the first's delete.
		admitFirst bool
	}{{"admitted before the delete", true}, {"admitted after the delete", false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			clock := &testClock{now: time.Now()}
			free := make(chan struct{})
			cfg := Config{DataDir: dir, Clock: clock, TaskRetention: time.Hour, MaxQueued: 1}
			stops := holdJournal(&cfg, "x", free)
			b := setup(t, cfg)
			t.Cleanup(func() { b.d.Close() })
			const x = `{"task_id":"x","task_type":"t","label":"m","return_result":false}`

			first := b.postAsync(x)
			a := nextStop(t, stops, "accept", true) // wrote the record
			second := b.postAsync(x)
			s := nextStop(t, stops, "accept", false) // found it pending
			// The queue fills; the first is refused at admission and stops before its
			// delete.
			if code, out := b.post("/run-task", `{"task_id":"q","task_type":"t","label":"m","return_result":false}`); code != http.StatusAccepted {
				t.Fatalf("filler: %d %v", code, out)
			}
			close(a.release)
			f := nextStop(t, stops, "forget", false)
			if !tc.admitFirst {
				close(free)
				close(f.release)
				if got := answerWithin(t, "first submission", first); got.status != http.StatusTooManyRequests {
					t.Fatalf("first submission: %d %v, want 429", got.status, got.body)
				}
			}
			// A worker takes the filler, which makes room for the second.
			w := b.dial("w1", "m")
			if got := w.assignment(); got.TaskId != "q" {
				t.Fatalf("worker got %s, want q", got.TaskId)
			}
			if tc.admitFirst {
				close(s.release)
				if got := answerWithin(t, "second submission", second); got.status != http.StatusAccepted {
					t.Fatalf("second submission: %d %v, want 202", got.status, got.body)
				}
				close(free)
				close(f.release)
				if got := answerWithin(t, "first submission", first); got.status != http.StatusTooManyRequests {
					t.Fatalf("first submission: %d %v, want 429", got.status, got.body)
				}
			} else {
				close(s.release)
				if got := answerWithin(t, "second submission", second); got.status != http.StatusAccepted {
					t.Fatalf("second submission: %d %v, want 202", got.status, got.body)
				}
			}

			// Crash: the accepted task must be in the journal for the next start.
			if err := b.d.Close(); err != nil {
				t.Fatal(err)
			}
			after := setupJournaled(t, dir, clock)
			if code, out := after.get("/tasks/x"); code != http.StatusOK || out["status"] != "queued" {
				t.Fatalf("task x, accepted with 202, after a restart: %d %v", code, out)
			}
		})
	}
}
