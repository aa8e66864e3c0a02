package sim

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Result is one policy's figures on one scenario. Times are in seconds.
type Result struct {
	Policy string `json:"policy"`
	Tasks  int    `json:"tasks"`
	Failed int    `json:"failed"`
	// Misses counts label loads; Compulsory is the floor (distinct labels requested).
	Misses     int `json:"label_misses"`
	Compulsory int `json:"compulsory_misses"`
	Evictions  int `json:"evictions"`
	// AvgTaskRuntime is the time per task on the worker (the seed's metric, as the
	// agent reports it): the run, plus the wait for the label, whether the task
	// loaded it or waited for a load another task had started there.
	AvgTaskRuntime float64 `json:"avg_task_runtime_s"`
	MeanLatency    float64 `json:"mean_latency_s"`
	P50Latency     float64 `json:"p50_latency_s"`
	P95Latency     float64 `json:"p95_latency_s"`
	P99Latency     float64 `json:"p99_latency_s"`
	MeanQueueWait  float64 `json:"mean_queue_wait_s"`
	Utilisation    float64 `json:"utilisation"`
	Makespan       float64 `json:"makespan_s"`

	queueWait   time.Duration
	taskRuntime time.Duration
	sent        map[int]int
}

func (e *engine) result() Result {
	r := e.res
	r.Tasks = e.finished
	r.Compulsory = len(e.distinct)
	n := float64(max(e.finished, 1))
	r.AvgTaskRuntime = r.taskRuntime.Seconds() / n
	r.MeanQueueWait = r.queueWait.Seconds() / n
	sort.Float64s(e.latencies)
	sum := 0.0
	for _, v := range e.latencies {
		sum += v
	}
	r.MeanLatency = sum / n
	r.P50Latency, r.P95Latency, r.P99Latency = pct(e.latencies, 0.50), pct(e.latencies, 0.95), pct(e.latencies, 0.99)
	r.Makespan = e.clock.now.Seconds()
	if slots := float64(e.sc.Workers.Count * e.sc.Workers.Slots); r.Makespan > 0 {
		r.Utilisation = e.busy.Seconds() / (slots * r.Makespan)
	}
	return r
}

// pct is the nearest-rank percentile of sorted values.
func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Report is the comparison of policies on one scenario.
type Report struct {
	Scenario Scenario `json:"scenario"`
	Seed     uint64   `json:"seed"`
	Results  []Result `json:"results"`
	// WallSeconds is how long the simulation took in real time.
	WallSeconds float64 `json:"wall_seconds"`
}

// Compare runs every policy on the scenario with one seed.
func Compare(sc Scenario, policies []string, seed uint64, opt Options) (Report, error) {
	start := time.Now()
	rep := Report{Scenario: sc, Seed: seed}
	for _, p := range policies {
		r, err := Run(sc, p, seed, opt)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", p, err)
		}
		rep.Results = append(rep.Results, r)
	}
	rep.WallSeconds = time.Since(start).Seconds()
	return rep, nil
}

// WriteTable prints the comparison for people.
func (rep Report) WriteTable(w io.Writer) error {
	sc := rep.Scenario
	fmt.Fprintf(w, "scenario %s: %d workers × %d labels × %d slots, %d labels (%s), %s arrivals, seed %d\n",
		sc.Name, sc.Workers.Count, sc.Workers.MaxLabels, sc.Workers.Slots, sc.Labels.Count,
		orDefault(sc.Labels.Popularity, "uniform"), sc.Arrival.Kind, rep.Seed)
	for _, n := range sc.Notes {
		fmt.Fprintln(w, n)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\ttasks\tmisses\tfloor\tevictions\tavg runtime\tmean lat\tp50\tp95\tp99\tqueue wait\tutil\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f%%\t\n", r.Policy, r.Tasks, r.Misses, r.Compulsory, r.Evictions,
			secs(r.AvgTaskRuntime), secs(r.MeanLatency), secs(r.P50Latency), secs(r.P95Latency), secs(r.P99Latency),
			secs(r.MeanQueueWait), 100*r.Utilisation)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n(simulated in %.2f s of real time)\n", rep.WallSeconds)
	return err
}

func secs(v float64) string {
	switch {
	case v >= 10:
		return fmt.Sprintf("%.1fs", v)
	case v >= 1:
		return fmt.Sprintf("%.2fs", v)
	}
	return fmt.Sprintf("%.0fms", v*1000)
}

func orDefault(s, d string) string {
	if strings.TrimSpace(s) == "" {
		return d
	}
	return s
}
