package sim

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

// The scenario files kept in the repository stay valid as the format changes.
func TestScenarioFilesLoad(t *testing.T) {
	paths, err := filepath.Glob("../scenarios/*.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no scenario files (%v)", err)
	}
	for _, p := range paths {
		if _, err := Load(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// The seed scenarios' load and run times are the seed's own: its average task runtime
// is miss rate × load + run, and it published a (misses, runtime) pair for random and
// for its routing in each run. Solving the two gives the load and the run.
func TestSeedScenarioTimesSolveThePublishedPairs(t *testing.T) {
	t.Parallel()
	const requests = 2400.0
	cases := []struct {
		name                        string
		randomMisses, routingMisses float64
		randomRuntime, routingRun   float64 // seconds
	}{
		{"seed-4", 1193, 138, 0.2483, 0.0639},
		{"seed-5", 1448, 563, 0.3231, 0.1791},
	}
	for _, c := range cases {
		mRandom, mRouting := c.randomMisses/requests, c.routingMisses/requests
		load := (c.randomRuntime - c.routingRun) / (mRandom - mRouting)
		run := c.routingRun - mRouting*load
		sc := builtin(t, c.name)
		if sc.Load.Kind != "normal" || sc.Run.Kind != "normal" {
			t.Fatalf("%s: load %s, run %s; want normal distributions", c.name, sc.Load.Kind, sc.Run.Kind)
		}
		// The load stays the seed's stated 400 ms where the solution is within its
		// jitter; the run is the solution, to the millisecond.
		if got := sc.Load.Mean.D().Seconds(); math.Abs(got-load) > sc.Load.Stddev.D().Seconds() {
			t.Errorf("%s: load %.4f s; the seed's figures give %.4f s", c.name, got, load)
		}
		if got := sc.Run.Mean.D().Seconds(); math.Abs(got-run) > 0.001 {
			t.Errorf("%s: run %.4f s; the seed's figures give %.4f s", c.name, got, run)
		}
	}
}

// Ours starts from the estimates the dispatcher starts from: its defaults, or the
// priors a scenario sets as an operator sets the dispatcher's flags. It is not handed
// the scenario's true load and run times.
func TestOursStartsFromTheDispatcherPriors(t *testing.T) {
	t.Parallel()
	def := scheduler.Config{}.WithDefaults()
	sc := builtin(t, "fleet") // loads 2-8 s, runs 20-200 ms: far from the defaults
	clock := &vclock{base: time.Unix(0, 0)}
	r, err := NewRouter("ours", clock, 1, sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.(*scheduler.Scheduler).Config(); got.LoadTimePrior != def.LoadTimePrior || got.RunTimePrior != def.RunTimePrior {
		t.Errorf("unconfigured: priors %v / %v, want the dispatcher's defaults %v / %v",
			got.LoadTimePrior, got.RunTimePrior, def.LoadTimePrior, def.RunTimePrior)
	}

	withPriors, err := Parse([]byte(`
name: configured
workers: {count: 2, max_labels: 1, slots: 1}
labels: {count: 3}
load: {kind: fixed, value: 5s}
run: {kind: fixed, value: 100ms}
arrival: {kind: poisson, rate: 1}
tasks: 10
scheduler: {load_time_prior: 3s, run_time_prior: 80ms}
`))
	if err != nil {
		t.Fatal(err)
	}
	r, err = NewRouter("ours", clock, 1, withPriors, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.(*scheduler.Scheduler).Config(); got.LoadTimePrior != 3*time.Second || got.RunTimePrior != 80*time.Millisecond {
		t.Errorf("configured: priors %v / %v, want 3s / 80ms", got.LoadTimePrior, got.RunTimePrior)
	}

	withPriors.Scheduler.RunTimePrior = -1
	if err := withPriors.Validate(); err == nil || !strings.Contains(err.Error(), "scheduler.run_time_prior") {
		t.Errorf("negative prior: %v", err)
	}
}
