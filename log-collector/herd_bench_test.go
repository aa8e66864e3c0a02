package logcollector

import (
	"fmt"
	"runtime"
	rtmetrics "runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/protobuf/proto"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// BenchmarkHerdOfBacklogs is a collector restart as the fleet sees it: every agent
// connects and sends a full batch (512 KiB, the shipper's default) at the same moment.
// peak-heap-MiB is the largest heap seen while the herd is written (objects live or not
// yet collected, sampled every millisecond), with the default batch slots and with no
// practical bound. Run with -benchtime=Nx, N small, and -count to see the spread.
//
//	go test -run '^$' -bench HerdOfBacklogs -benchtime 3x -count 6 ./log-collector
func BenchmarkHerdOfBacklogs(b *testing.B) {
	const agents = 128
	record := `{"level":"info","msg":"` + strings.Repeat("x", 1000) + `"}`
	batch := &pb.LogBatch{Seq: 1}
	for len(batch.Records)*(len(record)+3) < 512<<10 {
		batch.Records = append(batch.Records, []byte(record))
	}
	// Marshalled once and shared: 128 copies on the agents' side (the agents run in this
	// process) would be measured as the collector's, and while they wait for the
	// collector to read them they raise the GC's goal, which made the peak swing from
	// 40 to 120 MiB between runs of the same code.
	frame, err := proto.Marshal(&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: batch}})
	if err != nil {
		b.Fatal(err)
	}
	for _, slots := range []int{DefaultMaxActiveBatches, 1 << 20} {
		b.Run(fmt.Sprintf("slots=%d", slots), func(b *testing.B) {
			b.ReportAllocs()
			var peak uint64
			for range b.N {
				r := startCollector(b, Config{MaxActiveBatches: slots})
				conns := make([]*agentConn, agents)
				for i := range conns {
					conns[i], _ = connect(b, r.ingestURL(), fmt.Sprintf("w%d", i), "s")
				}
				runtime.GC()
				stop := sampleHeap(&peak)
				var wg sync.WaitGroup
				for _, a := range conns {
					wg.Go(func() {
						if err := a.ws.WriteMessage(websocket.BinaryMessage, frame); err != nil {
							b.Errorf("send: %v", err)
							return
						}
						if e, err := a.read(); err != nil || e.GetAck() == nil {
							b.Errorf("ack: %v %v", e, err)
						}
					})
				}
				wg.Wait()
				stop()
				r.stop()
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		})
	}
}

// sampleHeap records the largest live heap into peak every millisecond until stop.
func sampleHeap(peak *uint64) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	go func() {
		defer close(exited)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			rtmetrics.Read(s)
			*peak = max(*peak, s[0].Value.Uint64())
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-exited }
}

// BenchmarkIdleStreams measures what connected, idle agent streams cost: heap and
// goroutine stacks per stream, after a GC. The agents' ends are in this process too,
// so the figures hold both sides of each connection.
//
//	go test -run '^$' -bench IdleStreams -benchtime 1x ./log-collector
func BenchmarkIdleStreams(b *testing.B) {
	const streams = 2000
	for range b.N {
		r := startCollector(b, Config{})
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		g := runtime.NumGoroutine()
		for i := range streams {
			connect(b, r.ingestURL(), fmt.Sprintf("w%d", i), "s")
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/streams, "heap-B/stream")
		b.ReportMetric(float64(after.StackInuse-before.StackInuse)/streams, "stack-B/stream")
		b.ReportMetric(float64(runtime.NumGoroutine()-g)/streams, "goroutines/stream")
		r.stop()
	}
}
