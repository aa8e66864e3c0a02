package dispatcher

import (
	"fmt"
	"slices"
	"testing"
	"time"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// BenchmarkOpsViews is what GET /workers, GET /workers?detail=true and GET /labels
// cost with 10,000 connected workers, each able to load 100 models (a Triton
// repository), and how long each holds the hub's lock, during which no task is
// routed. The detail and label views read the fleet viewChunk workers per hold; the
// median of those holds is hold-p50-µs. (Reading the whole fleet in one hold stalled
// the routing 3–5 ms per request; copying each worker's loadable labels under the
// lock made that 78 ms. It shares them.)
func BenchmarkOpsViews(b *testing.B) {
	cfg := Config{}.WithDefaults()
	var last time.Time
	var holds []time.Duration
	cfg.onViewChunk = func() {
		// Between two chunks: one hold, and the loop's few instructions.
		if now := time.Now(); !last.IsZero() {
			holds = append(holds, now.Sub(last))
		}
		last = time.Now()
	}
	h, err := newHub(cfg)
	if err != nil {
		b.Fatal(err)
	}
	repository := make([]string, 100)
	for i := range repository {
		repository[i] = fmt.Sprintf("model-%d", i)
	}
	for i := range 10_000 {
		wc := &workerConn{id: fmt.Sprintf("worker-%05d", i)}
		labels := []string{fmt.Sprintf("model-%d", i%50), fmt.Sprintf("model-%d", (i+1)%50), fmt.Sprintf("model-%d", (i+2)%50)}
		if err := h.addWorker(wc, &pb.Hello{WorkerId: wc.id, MaxLabels: 4, Slots: 1, HeldLabels: labels, LoadableLabels: repository}, nil); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		view func() int
	}{
		{"workers", func() int { return len(h.workerIDs()) }},
		{"workers-locked", func() int { return len(h.workerIDsLocked()) }}, // the one hold
		{"workers-detail", func() int { return len(h.workerDetails()) }},
		{"labels", func() int { return len(h.labelHolders()) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			holds = holds[:0]
			b.ReportAllocs()
			for b.Loop() {
				last = time.Time{}
				if c.view() == 0 {
					b.Fatal("empty view")
				}
			}
			if len(holds) > 0 {
				// The median hold; the tail is the machine's (GC, preemption), not the walk's.
				slices.Sort(holds)
				b.ReportMetric(float64(holds[len(holds)/2].Nanoseconds())/1e3, "hold-p50-µs")
			}
		})
	}
}
