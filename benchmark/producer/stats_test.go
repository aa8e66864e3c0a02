package producer

import (
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	t.Parallel()
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, time.Duration(i)*time.Millisecond)
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"p50 of 1..100", hundred, 50, 50 * time.Millisecond},
		{"p95 of 1..100", hundred, 95, 95 * time.Millisecond},
		{"p99 of 1..100", hundred, 99, 99 * time.Millisecond},
		{"p100 of 1..100", hundred, 100, 100 * time.Millisecond},
		{"p1 of 1..100", hundred, 1, time.Millisecond},
		{"empty", nil, 50, 0},
		{"one value", []time.Duration{7}, 99, 7},
		{"p50 of four is the second", []time.Duration{1, 2, 3, 4}, 50, 2},
		{"p95 of four is the last", []time.Duration{1, 2, 3, 4}, 95, 4},
		{"p0 clamps to the first", []time.Duration{1, 2, 3, 4}, 0, 1},
	}
	for _, tt := range tests {
		if got := Percentile(tt.sorted, tt.p); got != tt.want {
			t.Errorf("%s: Percentile(p%v) = %v, want %v", tt.name, tt.p, got, tt.want)
		}
	}
}

func TestLatencies(t *testing.T) {
	t.Parallel()
	in := []time.Duration{40, 10, 30, 20}
	orig := slices.Clone(in)
	got := Latencies(in)
	want := LatencyStats{Count: 4, Mean: 25, Min: 10, Max: 40, P50: 20, P90: 40, P95: 40, P99: 40}
	if got != want {
		t.Errorf("Latencies = %+v, want %+v", got, want)
	}
	if !slices.Equal(in, orig) {
		t.Error("Latencies reordered its input")
	}
	if (Latencies(nil) != LatencyStats{}) {
		t.Error("Latencies(nil) is not zero")
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	records := []Record{
		{Sync: true, Dispatched: true, OK: true, LabelMiss: true, Start: t0, Latency: 100 * time.Millisecond},
		{Sync: true, Dispatched: true, OK: true, Start: t0.Add(50 * time.Millisecond), Latency: 300 * time.Millisecond},
		{Sync: true, Dispatched: false, Error: "HTTP 503: full", Start: t0.Add(time.Second), Latency: time.Millisecond},
		{Sync: false, Dispatched: true, Error: `task ended "failed"`, Start: t0.Add(time.Second), Latency: 2 * time.Second},
		{Sync: false, Dispatched: true, OK: true, Start: t0.Add(1500 * time.Millisecond), Latency: 200 * time.Millisecond},
	}
	s := Summarize(records)
	if s.Requests != 5 || s.Failed != 2 || s.Sync != 3 || s.Dispatched != 4 || s.Completed != 3 || s.LabelMisses != 1 {
		t.Errorf("counts: %+v", s)
	}
	// Latency over the three completed requests only.
	if s.Latency.Count != 3 || s.Latency.Mean != 200*time.Millisecond || s.Latency.P50 != 200*time.Millisecond || s.Latency.Max != 300*time.Millisecond {
		t.Errorf("latency: %+v", s.Latency)
	}
	// From t0 to the failed async request's end at 3 s.
	if s.Wall != 3*time.Second || s.Throughput != 1 {
		t.Errorf("wall %v throughput %v, want 3s and 1/s", s.Wall, s.Throughput)
	}
	if s.Errors["HTTP 503: full"] != 1 || s.Errors[`task ended "failed"`] != 1 {
		t.Errorf("errors: %v", s.Errors)
	}
	if z := Summarize(nil); z.Requests != 0 || z.Wall != 0 || z.Throughput != 0 {
		t.Errorf("Summarize(nil) = %+v", z)
	}
}
