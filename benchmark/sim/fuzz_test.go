package sim

import (
	"os"
	"path/filepath"
	"testing"
)

// A scenario file is user input. Parse refuses a bad one with an error, and a scenario
// it accepts simulates to the end under both of the dispatcher's policies: every task
// finishes or fails, none is left waiting, and nothing panics. Fleets and task counts
// are bounded here only to keep each input fast.
func FuzzParseScenario(f *testing.F) {
	paths, err := filepath.Glob("../scenarios/*.yaml")
	if err != nil || len(paths) == 0 {
		f.Fatalf("no scenario files (%v)", err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("workers: {count: 2, max_labels: 1, slots: 2}\nlabels: {count: 3, popularity: shifting, exponent: 1, shift_every: 1s, shift_by: 1}\n" +
		"load: {kind: exponential, mean: 400ms}\nrun: {kind: uniform, min: 0s, max: 80ms}\narrival: {kind: poisson, utilisation: 0.9}\ntasks: 40\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		sc, err := Parse(b)
		if err != nil {
			return
		}
		if sc.Arrival.Kind == "trace" || sc.Tasks > 200 || sc.Workers.Count > 16 || sc.Labels.Count > 64 ||
			sc.Workers.Slots > 8 || sc.Workers.MaxLabels > 64 {
			t.Skip()
		}
		for _, policy := range []string{"ours", "random"} {
			res, err := Run(sc, policy, 1, Options{})
			if err != nil {
				t.Fatalf("%s: %v", policy, err)
			}
			if res.Tasks+res.Failed != sc.Tasks {
				t.Fatalf("%s: %d finished and %d failed of %d tasks", policy, res.Tasks, res.Failed, sc.Tasks)
			}
		}
	})
}
