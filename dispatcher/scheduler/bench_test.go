package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkAssign measures one routing decision plus its completion (Submit then
// Complete) across fleet and label-set sizes, for each path a task can take: "hit" (an
// idle worker holds the label), "load" (nobody holds it: a free worker loads it,
// evicting), and "mixed" (a label drawn at random from the whole set, so the hit rate
// falls as labels outnumber worker capacity). Each path's cost per operation must stay
// flat as workers and labels grow.
func BenchmarkAssign(b *testing.B) {
	for _, path := range []string{"hit", "load", "mixed"} {
		for _, workers := range []int{10, 1_000, 10_000} {
			for _, labels := range []int{10, 1_000, 100_000} {
				if path == "load" && labels <= 2*workers {
					continue // every label is held: there is no load path to measure
				}
				b.Run(fmt.Sprintf("%s/workers=%d/labels=%d", path, workers, labels), func(b *testing.B) {
					benchAssign(b, path, workers, labels)
				})
			}
		}
	}
}

func benchAssign(b *testing.B, path string, workers, labels int) {
	clock := &fakeClock{now: time.Unix(0, 0)}
	s, err := New(Config{Seed: 1}, clock)
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, labels)
	for i := range names {
		names[i] = fmt.Sprintf("label-%d", i)
	}
	for i := 0; i < workers; i++ {
		spec := WorkerSpec{ID: fmt.Sprintf("w%d", i), MaxLabels: 2, Slots: 1,
			Labels: []string{names[(2*i)%labels], names[(2*i+1)%labels]}}
		if _, err := s.AddWorker(spec); err != nil {
			b.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	picks := make([]int, 4096)
	for i := range picks {
		switch path {
		case "hit": // a label some worker holds at setup, and keeps: hits never evict
			picks[i] = rng.IntN(min(labels, 2*workers))
		case "load": // a label beyond what the fleet can hold
			picks[i] = 2*workers + rng.IntN(labels-2*workers)
		default:
			picks[i] = rng.IntN(labels)
		}
	}
	var task Task
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		task = Task{ID: "t", Label: names[picks[i%len(picks)]]}
		out, err := s.Submit(&task)
		if err != nil || len(out.Assigned) != 1 {
			b.Fatalf("submit: %v %+v", err, out)
		}
		w := out.Assigned[0].WorkerID
		if _, err := s.Complete(w, &task, Observation{RunTime: time.Millisecond}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWaitEstimate measures the wait estimate a placement makes when every holder
// of the label is busy (the throughput benchmark's steady state: 8 workers of 8 slots,
// every one holding all 5 labels, tasks of the labels in turn).
func BenchmarkWaitEstimate(b *testing.B) {
	clock := &fakeClock{now: time.Unix(0, 0)}
	s, err := New(Config{Seed: 1}, clock)
	if err != nil {
		b.Fatal(err)
	}
	labels := []string{"label-1", "label-2", "label-3", "label-4", "label-5"}
	for i := 0; i < 8; i++ {
		if _, err := s.AddWorker(WorkerSpec{ID: fmt.Sprintf("w%d", i), MaxLabels: 5, Slots: 8, Labels: labels}); err != nil {
			b.Fatal(err)
		}
	}
	tasks := make([]Task, 64)
	for i := range tasks {
		tasks[i] = Task{ID: fmt.Sprint(i), Label: labels[i%len(labels)]}
		if out, err := s.Submit(&tasks[i]); err != nil || len(out.Assigned) != 1 {
			b.Fatalf("submit %d: %v %+v", i, err, out)
		}
	}
	clock.now = clock.now.Add(time.Millisecond)
	ls := s.labels["label-1"]
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.loadWins("label-1", ls, 3, 0)
	}
}

// BenchmarkBusyFleet measures Submit then Complete on a fleet whose other slots are all
// busy (1,000 workers of 4 slots, 3,999 attempts running), with and without task
// deadlines: the difference is what keeping running attempts in a deadline heap (for
// ExpireRunning) costs a task.
func BenchmarkBusyFleet(b *testing.B) {
	for _, withDeadline := range []bool{false, true} {
		b.Run(fmt.Sprintf("deadline=%v", withDeadline), func(b *testing.B) {
			clock := &fakeClock{now: time.Unix(0, 0)}
			s, err := New(Config{Seed: 1}, clock)
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < 1000; i++ {
				if _, err := s.AddWorker(WorkerSpec{ID: fmt.Sprintf("w%d", i), MaxLabels: 1, Slots: 4, Labels: []string{"m"}}); err != nil {
					b.Fatal(err)
				}
			}
			deadline := func(i int) time.Time {
				if !withDeadline {
					return time.Time{}
				}
				return clock.now.Add(time.Minute + time.Duration(i%1000)*time.Millisecond)
			}
			busy := make([]Task, 3999)
			for i := range busy {
				busy[i] = Task{ID: fmt.Sprint(i), Label: "m", Deadline: deadline(i)}
				if out, err := s.Submit(&busy[i]); err != nil || len(out.Assigned) != 1 {
					b.Fatalf("submit %d: %v %+v", i, err, out)
				}
			}
			var task Task
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				task = Task{ID: "t", Label: "m", Deadline: deadline(i)}
				out, err := s.Submit(&task)
				if err != nil || len(out.Assigned) != 1 {
					b.Fatalf("submit: %v %+v", err, out)
				}
				if _, err := s.Complete(out.Assigned[0].WorkerID, &task, Observation{RunTime: time.Millisecond}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPickBacklog measures a completion that refills its worker from a standing
// queue, then a submission that joins the queue: the pick path, which BenchmarkAssign
// (whose queue is always empty) never reaches. 8 workers of 1 slot each hold all 6
// labels, 32 tasks queued: every pick takes the oldest task. (With workers holding 2
// of the labels, their loads and evictions made the cost per operation depend on b.N,
// 640 to 3,100 ns from run to run.)
func BenchmarkPickBacklog(b *testing.B) {
	clock := &fakeClock{now: time.Unix(0, 0)}
	s, err := New(Config{Seed: 1}, clock)
	if err != nil {
		b.Fatal(err)
	}
	labels := []string{"l0", "l1", "l2", "l3", "l4", "l5"}
	for i := 0; i < 8; i++ {
		spec := WorkerSpec{ID: fmt.Sprintf("w%d", i), MaxLabels: len(labels), Slots: 1, Labels: labels}
		if _, err := s.AddWorker(spec); err != nil {
			b.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pool := make([]Task, 40) // 8 running and 32 queued
	var running, done []*Task
	for i := range pool {
		done = append(done, &pool[i])
	}
	submit := func() {
		t := done[len(done)-1]
		done = done[:len(done)-1]
		*t = Task{ID: "t", Label: labels[rng.IntN(len(labels))]}
		out, err := s.Submit(t)
		if err != nil {
			b.Fatal(err)
		}
		for _, a := range out.Assigned {
			running = append(running, a.Task)
		}
	}
	for i := 0; i < 40; i++ {
		submit()
	}
	if s.QueuedTasks() == 0 {
		b.Fatal("no backlog")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := running[0]
		running = append(running[:0], running[1:]...) // in place: the benchmark allocates nothing
		out, err := s.Complete(t.WorkerID(), t, Observation{RunTime: 50 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		done = append(done, t)
		for _, a := range out.Assigned {
			running = append(running, a.Task)
		}
		submit()
	}
	b.StopTimer()
	if q := s.QueuedTasks(); q != 32 || len(running) != 8 {
		b.Fatalf("%d queued and %d running at the end, want 32 and 8", q, len(running))
	}
}

// BenchmarkPickPastUnloadable measures a completion on a worker whose backend lists
// `loadable` labels, in a queue led by `ahead` tasks of a label only another, busy,
// worker can load: the freed worker walks past them for rule 4 before it takes the next
// task of the label it holds (then a new task of that label joins the queue). With
// ahead past passOverWalk the walk alone cannot see what lies behind them.
func BenchmarkPickPastUnloadable(b *testing.B) {
	for _, ahead := range []int{16, 200} {
		for _, loadable := range []int{2, 1000} {
			b.Run(fmt.Sprintf("ahead=%d/loadable=%d", ahead, loadable), func(b *testing.B) {
				benchPickPastUnloadable(b, ahead, loadable)
			})
		}
	}
}

func benchPickPastUnloadable(b *testing.B, ahead, loadable int) {
	clock := &fakeClock{now: time.Unix(0, 0)}
	s, err := New(Config{Seed: 1, FleetSettle: time.Hour}, clock)
	if err != nil {
		b.Fatal(err)
	}
	list := []string{"c"}
	for i := 1; i < loadable; i++ {
		list = append(list, fmt.Sprintf("other-%d", i))
	}
	if _, err := s.AddWorker(WorkerSpec{ID: "ha", MaxLabels: 1, Slots: 1, Labels: []string{"a"}, Loadable: []string{"a"}}); err != nil {
		b.Fatal(err)
	}
	if _, err := s.AddWorker(WorkerSpec{ID: "w", MaxLabels: 1, Slots: 1, Labels: []string{"c"}, Loadable: list}); err != nil {
		b.Fatal(err)
	}
	queuedA := make([]Task, ahead+1)
	for i := range queuedA { // the first runs on ha for good, the rest wait for it
		queuedA[i] = Task{ID: fmt.Sprint("a", i), Label: "a"}
		if _, err := s.Submit(&queuedA[i]); err != nil {
			b.Fatal(err)
		}
	}
	pool := make([]Task, 4)
	var cur *Task
	for i := 0; i < 2; i++ { // one runs on w, one waits
		pool[i] = Task{ID: "c", Label: "c"}
		out, err := s.Submit(&pool[i])
		if err != nil {
			b.Fatal(err)
		}
		if len(out.Assigned) == 1 {
			cur = out.Assigned[0].Task
		}
	}
	if cur == nil || s.QueuedTasks() != ahead+1 {
		b.Fatalf("set-up: running %v, %d queued, want %d", cur, s.QueuedTasks(), ahead+1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, err := s.Complete("w", cur, Observation{RunTime: 50 * time.Millisecond})
		if err != nil || len(out.Assigned) != 1 || out.Assigned[0].Task.Label != "c" {
			b.Fatalf("complete: %v %+v", err, out)
		}
		cur = out.Assigned[0].Task
		t := &pool[(i+2)%len(pool)]
		*t = Task{ID: "c", Label: "c"}
		if out, err := s.Submit(t); err != nil || len(out.Assigned) != 0 {
			b.Fatalf("submit: %v %+v", err, out)
		}
	}
}
