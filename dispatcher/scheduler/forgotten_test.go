package scheduler

import (
	"fmt"
	"testing"
	"time"
)

// A label evicted everywhere and forgotten keeps its learned load time when it
// returns. Here it loads in 4 s; a burst of six returns while nobody holds it. The
// first task loads it on holder, and the five behind it weigh waiting for that copy
// (its load and run, then a 50 ms run for each task ahead and its own) against a load
// on spare (a load and a half and a run). With 4 s known, waiting wins for all five;
// taken for the prior's 400 ms, the fifth (four ahead: 700 ms of waiting against a
// 650 ms load) loads a second copy of a 4 s model, evicting cold.
func TestReturningLabelKeepsItsLearnedLoadTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		forgotten int
		loads     int
	}{
		{"kept", 0, 1},
		{"none kept", -1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{LoadTimePrior: 400 * time.Millisecond, RunTimePrior: 50 * time.Millisecond, ForgottenLabels: tc.forgotten})
			b.worker("holder", 1, 1)
			b.worker("spare", 1, 1, "cold")
			first := b.task("slow")
			if a := one(t, b.submit(first)); a.WorkerID != "holder" || !a.Load {
				t.Fatalf("got %+v, want a load on holder, which has room", a)
			}
			if _, err := b.s.Complete("holder", first, Observation{Loaded: true, LoadTime: 4 * time.Second, RunTime: 50 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			b.clock.advance(time.Minute)
			b.s.LabelGone("holder", "slow")
			if b.s.labels["slow"] != nil {
				t.Fatal("slow still has state with no holder and nothing queued")
			}
			loads := 0
			for i := 0; i < 6; i++ {
				for _, a := range b.submit(b.task("slow")) {
					if a.Load {
						loads++
					}
				}
			}
			if loads != tc.loads {
				t.Fatalf("returning burst of 6 started %d loads, want %d (load estimate %v)", loads, tc.loads, b.s.stats("slow").load)
			}
		})
	}
}

// The forgotten labels' estimates are bounded: the least recently forgotten go first,
// a label that returns leaves its entry, and its slot is reused rather than the slice
// grown.
func TestForgottenIsBounded(t *testing.T) {
	t.Parallel()
	f := newForgotten(3)
	for i := 1; i <= 5; i++ {
		f.put(fmt.Sprintf("l%d", i), learned{est: estimate{load: time.Duration(i) * time.Second}, loads: i})
	}
	if f.len() != 3 || len(f.slots) != 3 {
		t.Fatalf("%d entries in %d slots after 5 puts, want 3 in 3", f.len(), len(f.slots))
	}
	for _, gone := range []string{"l1", "l2"} {
		if _, ok := f.take(gone); ok {
			t.Fatalf("%s kept, want the two least recently forgotten dropped", gone)
		}
	}
	if l, ok := f.take("l4"); !ok || l.est.load != 4*time.Second || l.loads != 4 {
		t.Fatalf("l4: %+v %v, want its 4s and 4 loads", l, ok)
	}
	if _, ok := f.take("l4"); ok {
		t.Fatal("l4 taken twice")
	}
	f.put("l6", learned{})
	f.put("l7", learned{}) // full again: drops l3, the oldest
	if f.len() != 3 || len(f.slots) != 3 {
		t.Fatalf("%d entries in %d slots, want 3 in 3", f.len(), len(f.slots))
	}
	for label, want := range map[string]bool{"l3": false, "l5": true, "l6": true, "l7": true} {
		if _, ok := f.take(label); ok != want {
			t.Fatalf("%s kept %v, want %v", label, ok, want)
		}
	}
	if f.len() != 0 || f.newest != -1 || f.oldest != -1 {
		t.Fatalf("emptied: %d entries, ends %d and %d", f.len(), f.newest, f.oldest)
	}
	none := newForgotten(-1)
	none.put("l1", learned{loads: 1})
	if _, ok := none.take("l1"); ok || len(none.slots) != 0 {
		t.Fatal("a negative size kept an entry")
	}
}

// A stream of one-off labels through the scheduler, each evicting the last, leaves
// ForgottenLabels entries and no more, and once full, forgetting allocates nothing.
func TestStreamOfOneOffLabelsKeepsForgottenBounded(t *testing.T) { // not parallel: AllocsPerRun
	b := setup(t, Config{ForgottenLabels: 100})
	b.worker("w", 1, 1)
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("one-off-%d", i)
	}
	task := &Task{}
	run := func(label string) {
		*task = Task{ID: "t", Label: label}
		out, err := b.s.Submit(task)
		if err != nil || len(out.Assigned) != 1 {
			t.Fatalf("submit %s: %v %+v", label, err, out)
		}
		if _, err := b.s.Complete("w", task, Observation{Loaded: true, LoadTime: time.Second, RunTime: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		run(name)
	}
	if f := &b.s.forgotten; f.len() != 100 || len(f.slots) != 100 || len(b.s.labels) != 1 {
		t.Fatalf("%d forgotten in %d slots, %d labels known, want 100, 100, 1", f.len(), len(f.slots), len(b.s.labels))
	}
	if raceDetector {
		return // the race detector's own allocations would count
	}
	i := 0
	if allocs := testing.AllocsPerRun(1000, func() { run(names[i%len(names)]); i++ }); allocs != 0 {
		t.Fatalf("%v allocations per one-off label, want 0", allocs)
	}
}
