package report

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/smartroute/smartroute/benchmark/producer"
)

// Comparison is routing and random dispatch measured back to back with the same seed.
type Comparison struct {
	Routing, Random Result
}

// Ratio is a comparison of one metric: how many times better routing did.
type Ratio struct {
	// Value is the metric's ratio in routing's favour: random/routing for misses,
	// runtimes and latencies, routing/random for throughput. It is +Inf when routing
	// scored zero and random did not, and NaN when both scored zero.
	Value float64
	// Text says it in words, such as "9.4x fewer misses".
	Text string
}

// lowerIsBetter compares a metric where routing should score lower.
func lowerIsBetter(routing, random float64, better, worse string) Ratio {
	return ratio(random, routing, better, worse)
}

// higherIsBetter compares a metric where routing should score higher.
func higherIsBetter(routing, random float64, better, worse string) Ratio {
	return ratio(routing, random, better, worse)
}

// ratio is num/den described with better when ≥ 1 and worse (inverted) when < 1.
func ratio(num, den float64, better, worse string) Ratio {
	switch {
	case num == 0 && den == 0:
		return Ratio{Value: math.NaN(), Text: "same (both zero)"}
	case den == 0:
		return Ratio{Value: math.Inf(1), Text: "∞ " + better}
	case num == 0:
		return Ratio{Value: 0, Text: "∞ " + worse}
	}
	v := num / den
	if v >= 1 {
		return Ratio{Value: v, Text: fmt.Sprintf("%.1fx %s", v, better)}
	}
	return Ratio{Value: v, Text: fmt.Sprintf("%.1fx %s", 1/v, worse)}
}

// noTasks is the ratio of a metric one run has no data for: a run that completed no
// task has an average runtime, a latency and misses of zero because nothing ran, which
// ratio would report as an infinite win.
var noTasks = Ratio{Value: math.NaN(), Text: "n/a (a run completed no task)"}

// workersRan says both runs' worker logs show completed tasks.
func (c Comparison) workersRan() bool {
	return c.Routing.Worker.TasksCompleted > 0 && c.Random.Worker.TasksCompleted > 0
}

// latency compares one end-to-end latency statistic: random/routing.
func (c Comparison) latency(pick func(producer.LatencyStats) time.Duration) Ratio {
	if c.Routing.Producer.Latency.Count == 0 || c.Random.Producer.Latency.Count == 0 {
		return noTasks
	}
	return lowerIsBetter(pick(c.Routing.Producer.Latency).Seconds(), pick(c.Random.Producer.Latency).Seconds(), "lower", "higher")
}

// Misses compares label misses: random/routing.
func (c Comparison) Misses() Ratio {
	if !c.workersRan() {
		return noTasks
	}
	return lowerIsBetter(float64(c.Routing.Worker.LabelMisses), float64(c.Random.Worker.LabelMisses), "fewer misses", "more misses")
}

// Runtime compares the average task runtime: random/routing.
func (c Comparison) Runtime() Ratio {
	if !c.workersRan() {
		return noTasks
	}
	return lowerIsBetter(c.Routing.Worker.AvgTaskRuntime.Seconds(), c.Random.Worker.AvgTaskRuntime.Seconds(), "shorter", "longer")
}

// P95 compares the p95 end-to-end latency: random/routing.
func (c Comparison) P95() Ratio {
	return c.latency(func(l producer.LatencyStats) time.Duration { return l.P95 })
}

// Throughput compares completed tasks per second: routing/random.
func (c Comparison) Throughput() Ratio {
	return higherIsBetter(c.Routing.Producer.Throughput, c.Random.Producer.Throughput, "higher", "lower")
}

// WriteComparison writes each run in the seed's layout, then the two side by side.
func WriteComparison(w io.Writer, c Comparison) error {
	ew := &errWriter{w: w}
	for _, r := range []Result{c.Routing, c.Random} {
		ew.printf("==== %s ====\n", r.Mode)
		if ew.err == nil {
			ew.err = WriteText(w, r)
		}
		ew.printf("\n")
	}
	ew.printf("==== routing vs random ====\n%s\n\n", c.Routing.Settings.Describe())
	if ew.err != nil {
		return ew.err
	}

	row := func(name, routing, random, ratio string) {
		line := fmt.Sprintf("%-24s%14s%14s   %s", name, routing, random, ratio)
		ew.printf("%s\n", strings.TrimRight(line, " "))
	}
	rt, rd := c.Routing, c.Random
	s := func(d time.Duration) string { return secs(d) + " s" }
	row("", "routing", "random", "ratio")
	row("Total Label Misses", fmt.Sprint(rt.Worker.LabelMisses), fmt.Sprint(rd.Worker.LabelMisses), c.Misses().Text)
	row("Tasks Completed", fmt.Sprint(rt.Worker.TasksCompleted), fmt.Sprint(rd.Worker.TasksCompleted), "")
	row("Average Task Runtime", s(rt.Worker.AvgTaskRuntime), s(rd.Worker.AvgTaskRuntime), c.Runtime().Text)
	if rt.Settings.TimeScale != 1 && rt.Settings.TimeScale > 0 {
		row("  at time-scale 1", s(rt.Settings.unscaledRuntime(rt.Worker)), s(rd.Settings.unscaledRuntime(rd.Worker)), "")
	}
	row("Total Failed Requests", fmt.Sprint(rt.Producer.Failed), fmt.Sprint(rd.Producer.Failed), "")
	row("Mean Latency", s(rt.Producer.Latency.Mean), s(rd.Producer.Latency.Mean), c.latency(func(l producer.LatencyStats) time.Duration { return l.Mean }).Text)
	row("p50 Latency", s(rt.Producer.Latency.P50), s(rd.Producer.Latency.P50), c.latency(func(l producer.LatencyStats) time.Duration { return l.P50 }).Text)
	row("p95 Latency", s(rt.Producer.Latency.P95), s(rd.Producer.Latency.P95), c.P95().Text)
	row("p99 Latency", s(rt.Producer.Latency.P99), s(rd.Producer.Latency.P99), c.latency(func(l producer.LatencyStats) time.Duration { return l.P99 }).Text)
	row("Throughput", fmt.Sprintf("%.2f /s", rt.Producer.Throughput), fmt.Sprintf("%.2f /s", rd.Producer.Throughput), c.Throughput().Text)
	row("Wall Time", fmt.Sprintf("%.1f s", rt.Producer.Wall.Seconds()), fmt.Sprintf("%.1f s", rd.Producer.Wall.Seconds()), "")
	return ew.err
}
