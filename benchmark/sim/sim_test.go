package sim

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

func builtin(t testing.TB, name string) Scenario {
	t.Helper()
	sc, ok := Builtin(name)
	if !ok {
		t.Fatalf("no built-in %s", name)
	}
	if err := sc.Validate(); err != nil {
		t.Fatalf("built-in %s invalid: %v", name, err)
	}
	return sc
}

func result(t *testing.T, rep Report, policy string) Result {
	t.Helper()
	for _, r := range rep.Results {
		if r.Policy == policy {
			return r
		}
	}
	t.Fatalf("no result for %s", policy)
	return Result{}
}

// The same seed gives the same figures: the simulator is deterministic.
func TestDeterministic(t *testing.T) {
	t.Parallel()
	sc := builtin(t, "seed-5")
	a, err := Compare(sc, Policies, 7, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Compare(sc, Policies, 7, Options{})
	if !reflect.DeepEqual(a.Results, b.Results) {
		t.Fatalf("same seed, different results:\n%+v\n%+v", a.Results, b.Results)
	}
	c, _ := Compare(sc, Policies, 8, Options{})
	if reflect.DeepEqual(a.Results, c.Results) {
		t.Fatal("another seed gave identical results")
	}
}

// The seed's scenarios: every task completes; ours meets the targets (seed-4: at
// most 8 misses; seed-5: at most 520) with a lower mean latency than the seed's
// routing; random and the seed's routing land near the seed's published misses.
func TestSeedScenarios(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                string
		oursMax             int
		randomNear, seedMax int
	}{
		{"seed-4", 8, 1193, 300},
		{"seed-5", 520, 1448, 650},
	}
	for _, c := range cases {
		rep, err := Compare(builtin(t, c.name), Policies, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		ours, greedy, random := result(t, rep, "ours"), result(t, rep, "seed-greedy"), result(t, rep, "random")
		for _, r := range rep.Results {
			if r.Tasks != 2400 || r.Failed != 0 || r.Compulsory > r.Misses {
				t.Errorf("%s %s: %+v", c.name, r.Policy, r)
			}
		}
		if ours.Misses > c.oursMax || ours.MeanLatency >= greedy.MeanLatency {
			t.Errorf("%s: ours %d misses, mean %.4fs; want <= %d and below seed-greedy's %.4fs",
				c.name, ours.Misses, ours.MeanLatency, c.oursMax, greedy.MeanLatency)
		}
		if d := random.Misses - c.randomNear; d < -120 || d > 120 || greedy.Misses > c.seedMax {
			t.Errorf("%s: random %d misses (seed published %d), seed-greedy %d", c.name, random.Misses, c.randomNear, greedy.Misses)
		}
	}
}

func TestParseScenario(t *testing.T) {
	t.Parallel()
	yamlText := `
name: tiny
workers: {count: 2, max_labels: 1, slots: 1}
labels: {count: 3, popularity: zipf, exponent: 1.2}
load: {kind: fixed, value: 1s}
run: {kind: uniform, min: 10ms, max: 30ms}
arrival: {kind: poisson, rate: 5}
tasks: 50
`
	sc, err := Parse([]byte(yamlText))
	if err != nil {
		t.Fatal(err)
	}
	jsonText := `{"name":"tiny","workers":{"count":2,"max_labels":1,"slots":1},"labels":{"count":3,"popularity":"zipf","exponent":1.2},
"load":{"kind":"fixed","value":"1s"},"run":{"kind":"uniform","min":"10ms","max":"30ms"},"arrival":{"kind":"poisson","rate":5},"tasks":50}`
	sj, err := Parse([]byte(jsonText))
	if err != nil || !reflect.DeepEqual(sc, sj) {
		t.Fatalf("YAML and JSON differ: %+v / %+v (%v)", sc, sj, err)
	}
	if _, err := Parse([]byte(yamlText + "colour: red\n")); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Fatalf("unknown field: %v", err)
	}
	bad := strings.Replace(yamlText, "rate: 5", "rate: 5, utilisation: 0.5", 1)
	if _, err := Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), "exactly one of rate and utilisation") {
		t.Fatalf("rate and utilisation: %v", err)
	}
	if _, err := Parse([]byte(strings.Replace(yamlText, "value: 1s", "value: soon", 1))); err == nil {
		t.Fatal("bad duration accepted")
	}
	// Durations past a task's longest deadline (24 h) overflowed the virtual clock once
	// a few tasks were added up: refused, naming the field.
	for _, edit := range [][2]string{{"value: 1s", "value: 2562047h"}, {"max: 30ms", "max: 25h"}} {
		if _, err := Parse([]byte(strings.Replace(yamlText, edit[0], edit[1], 1))); err == nil || !strings.Contains(err.Error(), strings.Split(edit[1], ":")[0]) {
			t.Errorf("%s: %v, want a refusal naming it", edit[1], err)
		}
	}
	closed := strings.Replace(yamlText, "kind: poisson, rate: 5", "kind: closed, producers: 1, wait_avg: 30h", 1)
	if _, err := Parse([]byte(closed)); err == nil || !strings.Contains(err.Error(), "arrival waits") {
		t.Errorf("a 30 h wait: %v, want a refusal", err)
	}
	rep, err := Compare(sc, Policies, 3, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Tasks != 50 {
			t.Errorf("%s ran %d tasks", r.Policy, r.Tasks)
		}
	}
}

func TestTraceArrivals(t *testing.T) {
	t.Parallel()
	sc, dir := traceScenario(t, 1, "# seconds,label\n0.0,a\n0.1,b\n0.2,a\n5,a\n")
	r, err := Run(sc, "ours", 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// One worker, one label at a time: a, b, a are three loads; the a at 5 s is a hit.
	if r.Tasks != 4 || r.Misses != 3 || r.Compulsory != 2 {
		t.Fatalf("trace result %+v", r)
	}
	os.WriteFile(filepath.Join(dir, "trace.csv"), []byte("zero,a\n"), 0o600)
	if _, err := Run(sc, "ours", 1, Options{}); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("bad trace: %v", err)
	}
}

// A trace's time is refused, naming its line, unless it is a number of seconds from 0
// to a year: a float beyond what a Duration holds (or inf, or NaN) used to arrive at
// MinInt64, 292 years before the start, through the secs < 0 check.
func TestTraceTimesOutOfRangeAreRefused(t *testing.T) {
	t.Parallel()
	sc, dir := traceScenario(t, 1, "0,a\n")
	for _, bad := range []string{"inf", "+Inf", "-inf", "NaN", "1e300", "9223372037", "-1", "31536000.001", "-0.5"} {
		if err := os.WriteFile(filepath.Join(dir, "trace.csv"), []byte("# t,label\n0,a\n"+bad+",a\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Run(sc, "ours", 1, Options{})
		if err == nil || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("time %s: error %v, want one naming line 3 and the time", bad, err)
		}
	}
	for _, good := range []string{"0", "-0", "31536000", "1e-3", "0x1p4"} {
		if _, err := parseTrace(strings.NewReader(good+",a\n"), "t"); err != nil {
			t.Errorf("time %s: %v", good, err)
		}
	}
}

// Arrivals are in time order, lines of equal time in file order.
func TestTraceOrder(t *testing.T) {
	t.Parallel()
	lines, err := parseTrace(strings.NewReader("2,c\n1,a\n\n# x\n1,b\n0.5, d \n"), "t")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range lines {
		got = append(got, fmt.Sprintf("%v %s", l.at, l.label))
	}
	if want := "[500ms d 1s a 1s b 2s c]"; fmt.Sprint(got) != want {
		t.Fatalf("trace read as %v, want %s", got, want)
	}
}

// A task sent to a worker whose copy of its label is still loading (another slot
// started the load) waits for that load, as on a real worker: it does not run at once.
// That wait counts in its runtime, as in the agent's (total_ms, from receiving the task
// to sending its result), though the task caused no miss.
func TestTaskOnALoadingCopyWaitsForTheLoad(t *testing.T) {
	t.Parallel()
	cases := []struct {
		trace string
		// The load takes 1 s and each run 100 ms. Both tasks end at 1.1 s: the first
		// loads and runs, the second waits for the rest of that load, then runs.
		latency, runtime float64
	}{
		{"0.0,a\n0.1,a\n", 1.05, (1.1 + 1.0) / 2},
		{"0.0,a\n0.0,a\n", 1.1, 1.1},
	}
	for _, c := range cases {
		sc, _ := traceScenario(t, 2, c.trace)
		for _, policy := range Policies {
			r, err := Run(sc, policy, 1, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Tasks != 2 || r.Misses != 1 || math.Abs(r.MeanLatency-c.latency) > 1e-9 || math.Abs(r.AvgTaskRuntime-c.runtime) > 1e-9 {
				t.Errorf("%q %s: %d tasks, %d loads, mean latency %.3fs, avg runtime %.3fs; want 2, 1, %.3fs, %.3fs",
					c.trace, policy, r.Tasks, r.Misses, r.MeanLatency, r.AvgTaskRuntime, c.latency, c.runtime)
			}
		}
	}
}

// The simulator has no delay outside a task, and the scheduler it drives learns none
// (see scheduler.Scheduler.DelaySlack): a task that joined another's load reports
// the wait as its load time, as the agent does, rather than leave it to look like a
// result that came back late. So the simulator's figures are those of a quiet host.
func TestSchedulerSeesNoDelay(t *testing.T) {
	t.Parallel()
	sc, _ := traceScenario(t, 2, "0.0,a\n0.1,a\n") // the second joins the first's load
	e, err := simulate(sc, "ours", 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d := e.router.(*scheduler.Scheduler).DelaySlack(); d != 0 {
		t.Fatalf("DelaySlack = %v, want 0", d)
	}
}

// The seed's closed loop never pauses less than the floor between a result and the
// next request of the same producer.
func TestClosedLoopMinimumWait(t *testing.T) {
	t.Parallel()
	sc := builtin(t, "seed-4")
	sc.Arrival.WaitAvg = 0
	sc.Arrival.WaitStddev = 0
	sc.Tasks = 100
	r, err := Run(sc, "ours", 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// 50 tasks per producer, each at least 100 ms apart: at least 49 × 100 ms.
	if r.Makespan < (49 * 100 * time.Millisecond).Seconds() {
		t.Fatalf("makespan %.2fs: pauses below the 100 ms floor", r.Makespan)
	}
}

// BenchmarkSimulate reports simulated tasks per second of real time (the issue asks for
// at least a million a minute on one core: 16,667/s).
func BenchmarkSimulate(b *testing.B) {
	sc := builtin(b, "fleet")
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Run(sc, "ours", 1, Options{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(sc.Tasks*b.N)/b.Elapsed().Seconds(), "tasks/s")
}

// The fleet scenario's targets (issue 3): ours at most half the p99 latency of
// seed-greedy and at most 0.7× that of ray-like, with at most half the misses of
// seed-greedy.
func TestFleetTargets(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("fleet simulates 150,000 tasks")
	}
	rep, err := Compare(builtin(t, "fleet"), []string{"seed-greedy", "ray-like", "ours"}, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ours, greedy, ray := result(t, rep, "ours"), result(t, rep, "seed-greedy"), result(t, rep, "ray-like")
	if ours.Tasks != 50_000 || ours.Failed != 0 {
		t.Fatalf("ours: %+v", ours)
	}
	if ours.P99Latency > 0.5*greedy.P99Latency || ours.P99Latency > 0.7*ray.P99Latency || 2*ours.Misses > greedy.Misses {
		t.Fatalf("ours p99 %.1fs, %d misses; seed-greedy p99 %.1fs, %d misses; ray-like p99 %.1fs",
			ours.P99Latency, ours.Misses, greedy.P99Latency, greedy.Misses, ray.P99Latency)
	}
}

// traceScenario is one worker with one label at a time and the given slots, fixed
// loads of 1 s and runs of 100 ms, and arrivals from trace; it returns the scenario and
// the directory of its trace.csv.
func traceScenario(t *testing.T, slots int, trace string) (Scenario, string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "trace.csv"), []byte(trace), 0o600); err != nil {
		t.Fatal(err)
	}
	scen := fmt.Sprintf(`{"name":"trace","workers":{"count":1,"max_labels":1,"slots":%d},"labels":{"count":1},
"load":{"kind":"fixed","value":"1s"},"run":{"kind":"fixed","value":"100ms"},"arrival":{"kind":"trace","file":"trace.csv"}}`, slots)
	path := filepath.Join(dir, "s.json")
	if err := os.WriteFile(path, []byte(scen), 0o600); err != nil {
		t.Fatal(err)
	}
	sc, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return sc, dir
}

// While every slot runs a task, a tick can start nothing: the simulator does not tick
// through it. Three tasks of 1000 hours once meant 360 million ticks and 90 s of real
// time (scenarios now stop at 24 h, still 13 million); the figures with and without
// ticking are the same.
func TestNoTicksWhileEverySlotIsBusy(t *testing.T) {
	t.Parallel()
	sc, err := Parse([]byte(`
workers: {count: 1, max_labels: 1, slots: 1}
labels: {count: 1}
load: {kind: fixed, value: 1ms}
run: {kind: fixed, value: 24h}
arrival: {kind: poisson, rate: 100}
tasks: 3
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, policy := range []string{"ours", "random"} {
		e, err := simulate(sc, policy, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if r := e.result(); r.Tasks != 3 || r.Makespan < 72*3600 {
			t.Fatalf("%s: %d tasks in %.0f s, want 3 in 72 h", policy, r.Tasks, r.Makespan)
		}
		if e.rebalances > 10 {
			t.Errorf("%s: %d rebalances for 3 tasks that each hold the only slot", policy, e.rebalances)
		}
	}
}
