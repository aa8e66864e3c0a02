package sim

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

// submission is one task as the router saw it arrive.
type submission struct {
	at       time.Duration
	label    string
	producer int
	id       string
}

// recorder is a router that notes every submission and when each task completed.
type recorder struct {
	Router
	clock     *vclock
	submitted []submission
	completed map[string]time.Duration // by task id
}

func (r *recorder) Submit(t *scheduler.Task) (*scheduler.Outcome, error) {
	r.submitted = append(r.submitted, submission{r.clock.now, t.Label, t.Ref.(*simTask).producer, t.ID})
	return r.Router.Submit(t)
}

func (r *recorder) Complete(workerID string, t *scheduler.Task, obs scheduler.Observation) (*scheduler.Outcome, error) {
	r.completed[t.ID] = r.clock.now
	return r.Router.Complete(workerID, t, obs)
}

// watch simulates sc under ours and returns what the router saw.
func watch(t *testing.T, sc Scenario, seed uint64) *recorder {
	t.Helper()
	clock := newClock()
	router, err := NewRouter("ours", clock, seed, sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Router: router, clock: clock, completed: map[string]time.Duration{}}
	if _, err := simulateOn(sc, "ours", seed, rec, clock); err != nil {
		t.Fatal(err)
	}
	return rec
}

// bursts groups consecutive submissions of one producer at one instant: what one
// arrival brought.
func bursts(subs []submission) [][]submission {
	var out [][]submission
	for i, s := range subs {
		if i > 0 && s.at == subs[i-1].at && s.producer == subs[i-1].producer {
			out[len(out)-1] = append(out[len(out)-1], s)
			continue
		}
		out = append(out, []submission{s})
	}
	return out
}

// burstScenario is a small fleet with the given arrival (YAML flow mapping) and tasks.
func burstScenario(t *testing.T, arrival string, tasks int) Scenario {
	t.Helper()
	sc, err := Parse([]byte(fmt.Sprintf(`
name: bursts
workers: {count: 3, max_labels: 2, slots: 1}
labels: {count: 8, popularity: zipf, exponent: 1.0}
load: {kind: normal, mean: 400ms, stddev: 50ms, min: 100ms}
run: {kind: normal, mean: 50ms, stddev: 10ms, min: 5ms}
arrival: %s
tasks: %d
`, arrival, tasks)))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// Each arrival brings a burst of tasks for one label at one instant, of the sizes the
// scenario gives, the last cut to the tasks left; a closed-loop producer sends its next
// burst only once every task of its last has finished and it has paused; and the same
// seed gives the same arrivals.
func TestBurstArrivals(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		arrival string
		tasks   int
		// sizes is what each producer's bursts must be, in order (-1: the open loop);
		// nil where the burst is random, checked against min and max instead.
		sizes    map[int][]int
		min, max int
	}{
		{"poisson fixed", "{kind: poisson, utilisation: 0.7, burst: {kind: fixed, size: 4}}", 202,
			map[int][]int{-1: append(repeat(4, 50), 2)}, 0, 0},
		{"poisson uniform", "{kind: poisson, rate: 30, burst: {kind: uniform, min: 2, max: 6}}", 400, nil, 2, 6},
		{"closed fixed", "{kind: closed, producers: 2, wait_avg: 300ms, wait_stddev: 100ms, min_wait: 100ms, burst: {kind: fixed, size: 3}}", 21,
			map[int][]int{0: {3, 3, 3, 2}, 1: {3, 3, 3, 1}}, 0, 0},
		{"closed uniform", "{kind: closed, producers: 3, wait_avg: 300ms, min_wait: 100ms, burst: {kind: uniform, min: 1, max: 5}}", 300, nil, 1, 5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sc := burstScenario(t, c.arrival, c.tasks)
			rec := watch(t, sc, 3)
			if len(rec.submitted) != c.tasks || len(rec.completed) != c.tasks {
				t.Fatalf("%d tasks submitted, %d completed; want %d", len(rec.submitted), len(rec.completed), c.tasks)
			}
			byProducer := map[int][][]submission{}
			seen := map[int]bool{}
			for _, b := range bursts(rec.submitted) {
				for _, s := range b {
					if s.label != b[0].label {
						t.Fatalf("a burst of %s at %v holds a task for %s", b[0].label, s.at, s.label)
					}
				}
				byProducer[b[0].producer] = append(byProducer[b[0].producer], b)
				seen[len(b)] = true
			}
			for p, bs := range byProducer {
				var sizes []int
				left := sc.Tasks
				if p >= 0 {
					left = (&engine{sc: sc}).quota(p)
				}
				for i, b := range bs {
					sizes = append(sizes, len(b))
					left -= len(b)
					if c.sizes == nil && (len(b) > c.max || len(b) < c.min && !(i == len(bs)-1 && left == 0)) {
						t.Errorf("producer %d burst %d: %d tasks, want %d to %d (fewer only when cut at the end)", p, i, len(b), c.min, c.max)
					}
					if p < 0 || i == 0 {
						continue
					}
					var done time.Duration // the producer's previous burst's last result
					for _, s := range bs[i-1] {
						done = max(done, rec.completed[s.id])
					}
					if pause := b[0].at - done; pause < sc.Arrival.MinWait.D() {
						t.Errorf("producer %d sent burst %d %v after its previous burst's last result, want at least %v", p, i, pause, sc.Arrival.MinWait.D())
					}
				}
				if left != 0 {
					t.Errorf("producer %d sent %d tasks too few", p, left)
				}
				if c.sizes != nil && !reflect.DeepEqual(sizes, c.sizes[p]) {
					t.Errorf("producer %d: bursts of %v, want %v", p, sizes, c.sizes[p])
				}
			}
			if c.sizes != nil && len(byProducer) != len(c.sizes) {
				t.Errorf("%d producers sent bursts, want %d", len(byProducer), len(c.sizes))
			}
			if c.sizes == nil {
				for n := c.min; n <= c.max; n++ {
					if !seen[n] {
						t.Errorf("no burst of %d tasks: sizes seen %v", n, seen)
					}
				}
			}

			if again := watch(t, sc, 3); !reflect.DeepEqual(again.submitted, rec.submitted) {
				t.Error("the same seed gave other arrivals")
			}
			if other := watch(t, sc, 4); reflect.DeepEqual(other.submitted, rec.submitted) {
				t.Error("another seed gave the same arrivals")
			}
		})
	}
}

func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// An open loop's rate counts tasks, not bursts: bursts of 5 at 100 tasks a second come
// 50 ms apart on average, and the last of 5000 tasks arrives near 50 s as without
// bursts.
func TestBurstRateCountsTasks(t *testing.T) {
	t.Parallel()
	for _, burst := range []string{"", ", burst: {kind: fixed, size: 5}", ", burst: {kind: uniform, min: 1, max: 9}"} {
		sc := burstScenario(t, "{kind: poisson, rate: 100"+burst+"}", 5000)
		rec := watch(t, sc, 1)
		bs := bursts(rec.submitted)
		last := bs[len(bs)-1][0].at
		gap := last / time.Duration(len(bs)-1)
		want := time.Duration(sc.Arrival.Burst.mean() * float64(10*time.Millisecond))
		if gap < want*9/10 || gap > want*11/10 {
			t.Errorf("%q: %d arrivals, %v apart on average; want %v ± 10%%", burst, len(bs), gap, want)
		}
		if last < 45*time.Second || last > 55*time.Second {
			t.Errorf("%q: last arrival at %v, want near 50s", burst, last)
		}
	}
}

// Without a burst a scenario runs as before bursts existed, and a fixed burst of one
// task is the same thing: every policy's figures are the same, seed for seed. (The
// scenarios in RESULTS.md were compared before and after, figure for figure: the
// default draws no random number.)
func TestBurstOfOneIsNoBurst(t *testing.T) {
	t.Parallel()
	for _, sc := range []Scenario{builtin(t, "seed-4"), burstScenario(t, "{kind: poisson, utilisation: 0.8}", 3000)} {
		one := sc
		one.Arrival.Burst = Burst{Kind: "fixed", Size: 1}
		for seed := uint64(1); seed <= 2; seed++ {
			a, err := Compare(sc, Policies, seed, Options{})
			if err != nil {
				t.Fatal(err)
			}
			b, err := Compare(one, Policies, seed, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a.Results, b.Results) {
				t.Errorf("%s seed %d: a burst of one differs from none:\n%+v\n%+v", sc.Name, seed, a.Results, b.Results)
			}
		}
	}
	// A scenario without a burst writes none in the report's JSON, as before.
	b, err := json.Marshal(builtin(t, "fleet"))
	if err != nil || strings.Contains(string(b), "burst") {
		t.Errorf("fleet's JSON names a burst: %s (%v)", b, err)
	}
}

// The burst is parsed strictly and refused, naming the field, unless it is one of
// the kinds with sizes from 1 to maxBurst; it does not apply to traces. A burst the
// parser accepts round-trips through the report's JSON.
func TestParseBurst(t *testing.T) {
	t.Parallel()
	const scenario = `
workers: {count: 2, max_labels: 1, slots: 1}
labels: {count: 3}
load: {kind: fixed, value: 1s}
run: {kind: fixed, value: 10ms}
arrival: {kind: %s, %s}
tasks: 50
`
	cases := []struct {
		arrival, burst string
		want           Burst  // when accepted
		err            string // what the refusal says, "" to accept
	}{
		{"poisson", "{kind: fixed, size: 4}", Burst{Kind: "fixed", Size: 4}, ""},
		{"poisson", "{kind: fixed, size: 1}", Burst{Kind: "fixed", Size: 1}, ""},
		{"poisson", "{kind: fixed, size: 10000}", Burst{Kind: "fixed", Size: 10000}, ""},
		{"poisson", "{kind: uniform, min: 1, max: 8}", Burst{Kind: "uniform", Min: 1, Max: 8}, ""},
		{"poisson", "{kind: uniform, min: 3, max: 3}", Burst{Kind: "uniform", Min: 3, Max: 3}, ""},
		{"closed", "{kind: uniform, min: 2, max: 16}", Burst{Kind: "uniform", Min: 2, Max: 16}, ""},
		{"poisson", "{kind: fixed, size: 0}", Burst{}, "arrival.burst.size must be from 1 to 10000 tasks, got 0"},
		{"poisson", "{kind: fixed, size: -3}", Burst{}, "arrival.burst.size must be from 1 to 10000 tasks, got -3"},
		{"poisson", "{kind: fixed, size: 10001}", Burst{}, "arrival.burst.size must be from 1 to 10000 tasks, got 10001"},
		{"poisson", "{kind: fixed}", Burst{}, "arrival.burst.size must be from 1"},
		{"poisson", "{kind: fixed, size: 4, max: 8}", Burst{}, "arrival.burst.min and max are for uniform bursts"},
		{"poisson", "{kind: uniform, min: 0, max: 4}", Burst{}, "1 <= min <= max <= 10000 tasks for a uniform burst, got 0..4"},
		{"poisson", "{kind: uniform, max: 4}", Burst{}, "got 0..4"},
		{"poisson", "{kind: uniform, min: 5, max: 4}", Burst{}, "got 5..4"},
		{"poisson", "{kind: uniform, min: 1, max: 10001}", Burst{}, "got 1..10001"},
		{"poisson", "{kind: uniform, size: 4, min: 1, max: 4}", Burst{}, "arrival.burst.size is for fixed bursts"},
		{"poisson", "{size: 4}", Burst{}, "arrival.burst.kind is required"},
		{"poisson", "{kind: geometric, mean: 4}", Burst{}, "mean"}, // unknown field
		{"poisson", "{kind: exponential, size: 4}", Burst{}, `arrival.burst.kind "exponential" unknown (fixed, uniform)`},
		{"poisson", "{kind: fixed, size: 2.5}", Burst{}, "size"},
		{"poisson", "{kind: fixed, size: many}", Burst{}, "size"},
		{"poisson", "4", Burst{}, "burst"},
		{"trace", "{kind: fixed, size: 2}", Burst{}, "arrival.burst does not apply to trace arrivals"},
	}
	for _, c := range cases {
		extra := "rate: 5"
		switch c.arrival {
		case "closed":
			extra = "producers: 2"
		case "trace":
			extra = "file: t.csv"
		}
		text := fmt.Sprintf(scenario, c.arrival, extra+", burst: "+c.burst)
		sc, err := Parse([]byte(text))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s burst %s: error %v, want one saying %q", c.arrival, c.burst, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s burst %s: %v", c.arrival, c.burst, err)
			continue
		}
		if sc.Arrival.Burst != c.want {
			t.Errorf("%s burst %s: read as %+v, want %+v", c.arrival, c.burst, sc.Arrival.Burst, c.want)
		}
		b, err := json.Marshal(sc)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := Parse(b); err != nil || !reflect.DeepEqual(back, sc) {
			t.Errorf("%s burst %s: JSON %s read back as %+v (%v)", c.arrival, c.burst, b, back, err)
		}
	}
}
