package dispatcher

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// BenchmarkRunTaskRoundTrip measures one synchronous task through the whole dispatcher:
// HTTP request, scheduling, assignment frame, result frame, HTTP answer, with 8 workers
// on real WebSockets that answer at once. Allocations per op include the client side.
func BenchmarkRunTaskRoundTrip(b *testing.B) {
	t := &testing.T{}
	d, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	bd := &bundle{t: t, d: d}
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	bd.srv = srv
	for i := 0; i < 8; i++ {
		h := http.Header{}
		h.Set("Worker-Id", fmt.Sprintf("bw%d", i))
		ws, _, err := websocket.DefaultDialer.Dial(bd.wsURL(), h)
		if err != nil {
			b.Fatal(err)
		}
		defer ws.Close()
		hello, _ := frame.Encode(nil, &pb.Envelope{Body: &pb.Envelope_Hello{Hello: &pb.Hello{
			ProtocolVersion: frame.ProtocolVersion, WorkerId: fmt.Sprintf("bw%d", i), MaxLabels: 5, Slots: 8}}})
		ws.WriteMessage(websocket.BinaryMessage, hello)
		go echoWorker(ws)
	}
	for len(d.hub.workerIDs()) < 8 {
		runtime.Gosched() // wait for the hellos to register
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			body := fmt.Sprintf(`{"task_id":"b-%d","task_type":"sample_task","label":"label-%d","parameters_json":"{\"data\": \"sample\"}"}`, i, i%5+1)
			resp, err := client.Post(srv.URL+"/run-task", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	d.hub.beginShutdown()
	for _, wc := range d.hub.closeWorkers(&Disconnect{Code: pb.CloseCode_CLOSE_CODE_SHUTDOWN, Reason: "done"}) {
		<-wc.done()
	}
}

// echoWorker answers every assignment at once with a fixed result.
func echoWorker(ws *websocket.Conn) {
	var buf []byte
	for {
		_, b, err := ws.ReadMessage()
		if err != nil {
			return
		}
		env, err := frame.Decode(b, 0)
		if err != nil {
			return
		}
		a := env.GetAssignment()
		if a == nil {
			continue
		}
		buf, _ = frame.Encode(buf[:0], &pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
			TaskId: a.TaskId, Attempt: a.Attempt, Ok: true, Result: []byte(`{"result":"ok"}`)}}})
		if err := ws.WriteMessage(websocket.BinaryMessage, bytes.Clone(buf)); err != nil {
			return
		}
	}
}
