package sim

import (
	"bytes"
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
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
	f.Add([]byte("workers: {count: 3, max_labels: 2, slots: 1}\nlabels: {count: 5, popularity: zipf, exponent: 1}\nload: {kind: fixed, value: 400ms}\n" +
		"run: {kind: fixed, value: 50ms}\narrival: {kind: poisson, rate: 40, burst: {kind: uniform, min: 1, max: 9}}\ntasks: 60\n"))
	f.Add([]byte("workers: {count: 2, max_labels: 2, slots: 2}\nlabels: {count: 4}\nload: {kind: fixed, value: 400ms}\nrun: {kind: fixed, value: 0s}\n" +
		"arrival: {kind: closed, producers: 3, wait_avg: 1s, min_wait: 0s, burst: {kind: fixed, size: 7}}\ntasks: 50\n"))
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

// A trace file is user input. parseTrace refuses a bad one with an error naming the
// line; what it accepts is every task line, each at a time from 0 to maxTraceTime,
// ordered by time with equal times in file order (as the engine pushes arrivals), and
// a short accepted trace simulates to the end under both of the dispatcher's
// policies. FuzzParseScenario skips trace scenarios, which need a file.
func FuzzParseTrace(f *testing.F) {
	for _, s := range []string{
		"# seconds,label\n0.0,a\n0.1,b\n0.2,a\n5,a\n", "2,c\n1,a\n\n1,b\r\n0.5, d \n", "inf,a\n", "NaN,a\n", "1e300,a\n",
		"9223372037,a\n", "-0,a\n", "31536000,a\n", "0x1p-2,a,b\n", "1,\n", ",a\n", "1_0,a\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		lines, err := parseTrace(bytes.NewReader(b), "fuzz")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "trace fuzz") {
				t.Fatalf("error %q does not name the trace", err)
			}
			return
		}
		// Each task line on its own, in file order: the lines parseTrace must return,
		// stably sorted by time.
		var want []traceLine
		for l := range strings.SplitSeq(string(b), "\n") {
			if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, "#") {
				continue
			}
			one, err := parseTrace(strings.NewReader(l), "fuzz")
			if err != nil || len(one) != 1 {
				t.Fatalf("line %q of an accepted trace read alone: %v, %v", l, one, err)
			}
			want = append(want, one[0])
		}
		slices.SortStableFunc(want, func(a, b traceLine) int { return cmp.Compare(a.at, b.at) })
		if !slices.Equal(lines, want) {
			t.Fatalf("trace read as %v, want its lines in time order %v", lines, want)
		}
		for _, l := range lines {
			if l.at < 0 || l.at > maxTraceTime || l.label == "" || l.label != strings.TrimSpace(l.label) {
				t.Fatalf("accepted line at %v labelled %q", l.at, l.label)
			}
		}
		if len(lines) > 32 {
			return // the simulation below is for short traces, to keep each input fast
		}
		sc, _ := traceScenario(t, 2, string(b))
		last := lines[len(lines)-1].at
		for _, policy := range []string{"ours", "random"} {
			res, err := Run(sc, policy, 1, Options{})
			if err != nil {
				t.Fatalf("%s: %v", policy, err)
			}
			if res.Tasks+res.Failed != len(lines) || res.Makespan < last.Seconds() || res.Makespan > (last+time.Hour).Seconds() {
				t.Fatalf("%s: %d finished and %d failed of %d tasks, makespan %vs after a last arrival at %v", policy, res.Tasks, res.Failed, len(lines), res.Makespan, last)
			}
		}
	})
}
