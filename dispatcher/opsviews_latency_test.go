package dispatcher

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// BenchmarkRunTaskWhileOpsPolled is the latency of synchronous tasks through the whole
// dispatcher (HTTP, scheduling, a real WebSocket worker that answers at once) beside
// 10,000 registered workers, with and without clients polling GET /workers?detail=true
// and GET /labels in a loop, as an unauthenticated dashboard (no --ops-auth) may. The
// 10,000 are registered with the hub directly (no sockets: they are never sent a
// frame, since no task's label is one they can load); the pollers' walks over them
// are the real ones. Reports per-task latency percentiles in microseconds.
func BenchmarkRunTaskWhileOpsPolled(b *testing.B) {
	d, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	fleet := make([]*workerConn, 10_000)
	for i := range fleet {
		wc := &workerConn{id: fmt.Sprintf("fleet-%05d", i)}
		fleet[i] = wc
		labels := []string{fmt.Sprintf("model-%d", i%50), fmt.Sprintf("model-%d", (i+1)%50), fmt.Sprintf("model-%d", (i+2)%50)}
		if err := d.hub.addWorker(wc, &pb.Hello{WorkerId: wc.id, MaxLabels: 4, Slots: 1, HeldLabels: labels, LoadableLabels: labels}, nil); err != nil {
			b.Fatal(err)
		}
	}
	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http") + "/worker-listen"
	for i := range 2 {
		id := fmt.Sprintf("real-%d", i)
		h := http.Header{}
		h.Set("Worker-Id", id)
		ws, _, err := websocket.DefaultDialer.Dial(wsURL, h)
		if err != nil {
			b.Fatal(err)
		}
		defer ws.Close()
		hello, _ := frame.Encode(nil, &pb.Envelope{Body: &pb.Envelope_Hello{Hello: &pb.Hello{
			ProtocolVersion: frame.ProtocolVersion, WorkerId: id, MaxLabels: 1, Slots: 4, HeldLabels: []string{"hot"}}}})
		if err := ws.WriteMessage(websocket.BinaryMessage, hello); err != nil {
			b.Fatal(err)
		}
		go echoWorker(ws)
	}
	for len(d.hub.workerIDs()) < 10_002 {
		runtime.Gosched() // wait for the hellos to register
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	task := 0
	runTask := func() time.Duration {
		task++
		body := fmt.Sprintf(`{"task_id":"t-%d","task_type":"x","label":"hot","parameters_json":"{}"}`, task)
		start := time.Now()
		resp, err := client.Post(srv.URL+"/run-task", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("run-task: status %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	for _, pollers := range []int{0, 1, 4} {
		b.Run(fmt.Sprintf("pollers=%d", pollers), func(b *testing.B) {
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for p := range pollers {
				wg.Go(func() {
					path := []string{"/workers?detail=true", "/labels"}[p%2]
					for {
						select {
						case <-stop:
							return
						default:
						}
						resp, err := client.Get(srv.URL + path)
						if err != nil {
							b.Error(err)
							return
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				})
			}
			var lat []time.Duration
			b.ReportAllocs()
			for b.Loop() {
				lat = append(lat, runTask())
			}
			close(stop)
			wg.Wait()
			slices.Sort(lat)
			at := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
			b.ReportMetric(at(0.5), "p50-µs")
			b.ReportMetric(at(0.99), "p99-µs")
			b.ReportMetric(at(1), "max-µs")
		})
	}
	for _, wc := range fleet { // no socket to close
		d.hub.removeWorker(wc)
	}
	d.hub.beginShutdown()
	for _, wc := range d.hub.closeWorkers(&Disconnect{Code: pb.CloseCode_CLOSE_CODE_SHUTDOWN, Reason: "done"}) {
		<-wc.done()
	}
}
