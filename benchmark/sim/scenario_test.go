package sim

import (
	"math"
	"path/filepath"
	"testing"
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
