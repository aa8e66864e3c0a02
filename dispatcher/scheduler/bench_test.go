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
		s.loadBeatsWait("label-1", ls, 3)
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
