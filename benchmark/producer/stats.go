package producer

import (
	"math"
	"slices"
	"time"
)

// Summary is what the producers' own records say about a run: the seed's producer
// counts plus end-to-end latency and throughput.
type Summary struct {
	// Requests is how many requests were sent.
	Requests int
	// Failed is how many did not end with a completed task.
	Failed int
	// Sync is how many were synchronous.
	Sync int
	// Dispatched is how many the dispatcher took in (Record.Dispatched), whether they
	// completed or not.
	Dispatched int
	// Completed is how many ended with a completed task.
	Completed int
	// LabelMisses is how many completed tasks the dispatcher said needed a load.
	LabelMisses int
	// Latency is over the completed requests only: a failed request's latency says
	// how long it took to fail, not how fast tasks run.
	Latency LatencyStats
	// Wall runs from the first request sent to the last outcome seen.
	Wall time.Duration
	// Throughput is Completed per second of Wall.
	Throughput float64
	// Errors counts the failed requests by error text, for the report.
	Errors map[string]int
}

// LatencyStats summarises a set of durations. Percentiles are nearest-rank.
type LatencyStats struct {
	Count              int
	Mean               time.Duration
	Min, Max           time.Duration
	P50, P90, P95, P99 time.Duration
}

// Summarize computes the Summary of a run's records.
func Summarize(records []Record) Summary {
	var s Summary
	var lat []time.Duration
	var first, last time.Time
	for _, r := range records {
		s.Requests++
		if r.Sync {
			s.Sync++
		}
		if r.Dispatched {
			s.Dispatched++
		}
		if r.OK {
			s.Completed++
			lat = append(lat, r.Latency)
			if r.LabelMiss {
				s.LabelMisses++
			}
		} else {
			s.Failed++
			if s.Errors == nil {
				s.Errors = map[string]int{}
			}
			s.Errors[r.Error]++
		}
		if r.Start.IsZero() {
			continue
		}
		if first.IsZero() || r.Start.Before(first) {
			first = r.Start
		}
		if end := r.Start.Add(r.Latency); end.After(last) {
			last = end
		}
	}
	s.Latency = Latencies(lat)
	if !first.IsZero() {
		s.Wall = last.Sub(first)
	}
	if s.Wall > 0 {
		s.Throughput = float64(s.Completed) / s.Wall.Seconds()
	}
	return s
}

// Latencies summarises ds; it does not modify ds.
func Latencies(ds []time.Duration) LatencyStats {
	if len(ds) == 0 {
		return LatencyStats{}
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	var sum float64
	for _, d := range sorted {
		sum += float64(d)
	}
	return LatencyStats{
		Count: len(sorted),
		Mean:  time.Duration(sum / float64(len(sorted))),
		Min:   sorted[0],
		Max:   sorted[len(sorted)-1],
		P50:   Percentile(sorted, 50),
		P90:   Percentile(sorted, 90),
		P95:   Percentile(sorted, 95),
		P99:   Percentile(sorted, 99),
	}
}

// Percentile is the nearest-rank p-th percentile (0 < p <= 100) of sorted, which must
// be in ascending order: the smallest value that at least p% of the values do not
// exceed. It is zero for an empty slice.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// p*n first keeps whole ranks exact (0.95*100 is not 95 in floating point).
	rank := int(math.Ceil(p*float64(len(sorted))/100 - 1e-9))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}
