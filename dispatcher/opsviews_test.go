package dispatcher

import (
	"fmt"
	"testing"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// BenchmarkOpsViews is what GET /workers?detail=true and GET /labels cost with 10,000
// connected workers, each able to load 100 models (a Triton repository). Both walk
// every worker under the hub's lock, during which no task is routed, so this is the
// longest stall one poll of a dashboard can cause. (Copying each worker's loadable
// labels under the lock made the detail view's stall 78 ms here; it shares them.)
func BenchmarkOpsViews(b *testing.B) {
	h, err := newHub(Config{}.WithDefaults())
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
	// The *-locked runs are the part under the hub's lock: the stall.
	for _, c := range []struct {
		name string
		view func() int
	}{
		{"workers-detail", func() int { return len(h.workerDetails()) }},
		{"workers-detail-locked", func() int { return len(h.workerSnapshot()) }},
		{"labels", func() int { return len(h.labelHolders()) }},
		{"labels-locked", func() int { return len(h.labelSnapshot()) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if c.view() == 0 {
					b.Fatal("empty view")
				}
			}
		})
	}
}
