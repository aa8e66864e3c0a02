package dispatcher

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
	"github.com/smartroute/smartroute/proto/frame"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// result answers an assignment the way an agent does, with the label-miss fields set.
func (w *fakeWorker) result(a *pb.TaskAssignment, ok, miss bool, loadUs int64) {
	w.write(&pb.Envelope{Body: &pb.Envelope_Result{Result: &pb.TaskResult{
		TaskId: a.TaskId, Attempt: a.Attempt, Ok: ok, Error: map[bool]string{false: "boom"}[ok],
		LabelMiss: miss, LoadDurationUs: loadUs, RunDurationUs: 1000}}})
}

// histogram returns a histogram's sample count and sum.
func histogram(t *testing.T, h prometheus.Histogram) (uint64, float64) {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// await is the answer on ch, failing the test if none comes within a bound.
func await(t *testing.T, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("no answer to the task")
		return answer{}
	}
}

// waitFor polls an observable condition until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A known sequence through a real dispatcher and a scripted worker on a real WebSocket:
// a hit, two label misses (one evicting), a worker error, a queued deadline, a lost
// worker, a shutdown; every counter, histogram and gauge holds what happened.
func TestMetricsAfterAKnownSequence(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Scheduler: scheduler.Config{MaxAttempts: 1}})
	m := b.d.hub.met
	b.d.hub.mu.Lock()
	m.scheduleEvery = 1 // time every scheduler call, so the count is exact
	b.d.hub.mu.Unlock()
	w := b.dial("w1", "a") // two labels, one slot, holds a

	ans := b.postAsync(`{"task_id":"t1","task_type":"x","label":"a"}`)
	w.result(w.assignment(), true, false, 0) // hit
	if got := await(t, ans); got.status != 200 {
		t.Fatalf("t1: %v", got)
	}
	ans = b.postAsync(`{"task_id":"t2","task_type":"x","label":"b"}`)
	w.result(w.assignment(), true, true, 300_000) // a load into free room
	if got := await(t, ans); got.status != 200 {
		t.Fatalf("t2: %v", got)
	}
	ans = b.postAsync(`{"task_id":"t3","task_type":"x","label":"c"}`)
	a3 := w.assignment()
	if a3.EvictLabel == "" {
		t.Fatalf("t3 on a full worker evicts nothing: %v", a3)
	}
	w.write(&pb.Envelope{Body: &pb.Envelope_LabelEvent{LabelEvent: &pb.LabelEvent{Kind: pb.LabelEvent_KIND_EVICTED, Label: a3.EvictLabel}}})
	w.result(a3, false, true, 100_000) // loaded, then the task failed
	if got := await(t, ans); got.status != 502 {
		t.Fatalf("t3: %v", got)
	}

	ans4 := b.postAsync(`{"task_id":"t4","task_type":"x","label":"c"}`)
	w.assignment() // t4 runs and never answers
	if code, _ := b.post("/run-task", `{"task_id":"t5","task_type":"x","label":"c","return_result":false}`); code != 202 {
		t.Fatalf("t5: %d", code)
	}
	if code, _ := b.post("/run-task", `{"task_id":"t6","task_type":"x","label":"d","timeout_ms":50}`); code != 504 {
		t.Fatalf("t6: %d", code)
	}
	gauges := `
# HELP smartroute_dispatcher_connected_workers Workers connected now.
# TYPE smartroute_dispatcher_connected_workers gauge
smartroute_dispatcher_connected_workers 1
# HELP smartroute_dispatcher_inflight_tasks Tasks assigned to a worker and not answered yet.
# TYPE smartroute_dispatcher_inflight_tasks gauge
smartroute_dispatcher_inflight_tasks 1
# HELP smartroute_dispatcher_queued_tasks_total Tasks waiting for a worker, all labels: the signal to scale workers on.
# TYPE smartroute_dispatcher_queued_tasks_total gauge
smartroute_dispatcher_queued_tasks_total 1
`
	if err := testutil.GatherAndCompare(m.reg, strings.NewReader(gauges), "smartroute_dispatcher_connected_workers",
		"smartroute_dispatcher_inflight_tasks", "smartroute_dispatcher_queued_tasks_total"); err != nil {
		t.Fatal(err)
	}
	queued := map[string]float64{}
	for _, mf := range gather(t, m.reg) {
		if mf.GetName() == "smartroute_dispatcher_queued_tasks" {
			for _, s := range mf.GetMetric() {
				queued[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
			}
		}
	}
	if queued["c"] != 1 || queued["a"] != 0 || queued["d"] != 0 || queued[otherLabel] != 0 || len(queued) != 5 {
		t.Fatalf("queued_tasks by label %v; want c=1 and zero for a, b, d, other", queued)
	}

	// The worker goes away: t4, on its only attempt, fails; shutdown fails t5.
	w.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(time.Second))
	if got := await(t, ans4); got.status != 503 {
		t.Fatalf("t4: %v", got)
	}
	waitFor(t, "the disconnect to be counted", func() bool {
		return testutil.ToFloat64(m.disconnects.WithLabelValues("normal")) == 1
	})
	if n, _ := b.d.hub.failAll("test shutdown"); n != 1 {
		t.Fatalf("failAll answered %d tasks, want t5", n)
	}

	for _, c := range []struct {
		name string
		got  prometheus.Collector
		want float64
	}{
		{"received a", m.received.WithLabelValues("a"), 1},
		{"received b", m.received.WithLabelValues("b"), 1},
		{"received c", m.received.WithLabelValues("c"), 3},
		{"received d", m.received.WithLabelValues("d"), 1},
		{"completed a", m.completed.WithLabelValues("a"), 1},
		{"completed b", m.completed.WithLabelValues("b"), 1},
		{"completed c", m.completed.WithLabelValues("c"), 0},
		{"hits a", m.hits.WithLabelValues("a"), 1},
		{"hits b", m.hits.WithLabelValues("b"), 0},
		{"loads b", m.loads.WithLabelValues("b"), 1},
		{"loads c", m.loads.WithLabelValues("c"), 1},
		{"loads a", m.loads.WithLabelValues("a"), 0},
		{"evictions", m.evictions.WithLabelValues(a3.EvictLabel), 1},
		{"connects", m.connects, 1},
		{"disconnects", m.disconnects, 1},
	} {
		if got := testutil.ToFloat64(c.got); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	failed := `
# HELP smartroute_dispatcher_tasks_failed_total Tasks answered with a failure, by reason: deadline, worker_error, workers_lost, shutdown, load_failed, label_failing, no_worker_can_load, worker_overran.
# TYPE smartroute_dispatcher_tasks_failed_total counter
smartroute_dispatcher_tasks_failed_total{label="c",reason="shutdown"} 1
smartroute_dispatcher_tasks_failed_total{label="c",reason="worker_error"} 1
smartroute_dispatcher_tasks_failed_total{label="c",reason="workers_lost"} 1
smartroute_dispatcher_tasks_failed_total{label="d",reason="deadline"} 1
`
	if err := testutil.CollectAndCompare(m.failed, strings.NewReader(failed)); err != nil {
		t.Error(err)
	}
	for _, h := range []struct {
		name      string
		h         prometheus.Histogram
		wantCount uint64
		wantSum   float64 // negative: not checked
	}{
		{"queue_wait", m.queueWait, 4, -1},        // t1..t4 started
		{"task_duration", m.taskDuration, 2, -1},  // t1, t2 completed
		{"load_duration", m.loadDuration, 2, 0.4}, // t2 and t3 loaded
		{"schedule", m.schedule, 6 + 3, -1},       // six submissions, three results
	} {
		n, sum := histogram(t, h.h)
		if n != h.wantCount || (h.wantSum >= 0 && (sum < h.wantSum-1e-9 || sum > h.wantSum+1e-9)) {
			t.Errorf("%s: %d samples summing to %v, want %d (sum %v)", h.name, n, sum, h.wantCount, h.wantSum)
		}
	}
}

func gather(t *testing.T, g prometheus.Gatherer) []*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// Past MetricsMaxLabels distinct labels, tasks count under label="other": a fleet with
// many labels keeps a bounded number of series.
func TestMetricsFoldLabelsPastTheCap(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MetricsMaxLabels: 2})
	m := b.d.hub.met
	for _, l := range []string{"x", "y", "z", "w", "x"} {
		if code, _ := b.post("/run-task", `{"task_type":"t","label":"`+l+`","return_result":false}`); code != 202 {
			t.Fatalf("label %s: %d", l, code)
		}
	}
	want := `
# HELP smartroute_dispatcher_tasks_received_total Tasks accepted by POST /run-task (resubmitted ids and refusals not counted).
# TYPE smartroute_dispatcher_tasks_received_total counter
smartroute_dispatcher_tasks_received_total{label="other"} 2
smartroute_dispatcher_tasks_received_total{label="x"} 2
smartroute_dispatcher_tasks_received_total{label="y"} 1
# HELP smartroute_dispatcher_queued_tasks Tasks waiting for a worker, by label (labels past --metrics-max-labels are "other").
# TYPE smartroute_dispatcher_queued_tasks gauge
smartroute_dispatcher_queued_tasks{label="other"} 2
smartroute_dispatcher_queued_tasks{label="x"} 2
smartroute_dispatcher_queued_tasks{label="y"} 1
`
	if err := testutil.GatherAndCompare(m.reg, strings.NewReader(want),
		"smartroute_dispatcher_tasks_received_total", "smartroute_dispatcher_queued_tasks"); err != nil {
		t.Fatal(err)
	}
}

// GET /metrics is valid Prometheus text with every documented family, and the names
// pass promlint.
func TestMetricsEndpointParses(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w := b.dial("w1", "m")
	ans := b.postAsync(`{"task_type":"x","label":"m"}`)
	w.result(w.assignment(), true, false, 0)
	await(t, ans)

	resp, err := http.Get(b.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
	for _, name := range []string{
		"smartroute_dispatcher_tasks_received_total", "smartroute_dispatcher_tasks_completed_total",
		"smartroute_dispatcher_label_hits_total", "smartroute_dispatcher_label_loads_total",
		"smartroute_dispatcher_evictions_total", "smartroute_dispatcher_queue_wait_seconds",
		"smartroute_dispatcher_task_duration_seconds", "smartroute_dispatcher_load_duration_seconds",
		"smartroute_dispatcher_queued_tasks", "smartroute_dispatcher_queued_tasks_total",
		"smartroute_dispatcher_inflight_tasks", "smartroute_dispatcher_connected_workers",
		"smartroute_dispatcher_worker_connects_total", "smartroute_dispatcher_schedule_duration_seconds",
		"go_goroutines", "process_cpu_seconds_total",
	} {
		if families[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if got := families["smartroute_dispatcher_tasks_completed_total"].GetMetric()[0].GetCounter().GetValue(); got != 1 {
		t.Errorf("completed over HTTP = %v, want 1", got)
	}
	problems, err := testutil.GatherAndLint(b.d.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		// queued_tasks_total is a gauge whose name the chart and dashboard fix; promlint
		// reserves _total for counters.
		if strings.HasPrefix(p.Metric, "smartroute_") && p.Metric != "smartroute_dispatcher_queued_tasks_total" {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
}

func TestCloseCodeNames(t *testing.T) {
	for code, want := range map[pb.CloseCode]string{
		pb.CloseCode_CLOSE_CODE_SHUTDOWN: "shutdown", pb.CloseCode_CLOSE_CODE_SLOW_WORKER: "slow_worker",
		pb.CloseCode_CLOSE_CODE_UNSPECIFIED: "unspecified", 1000: "normal", 1006: "abnormal", 4999: "other", 3000: "other",
	} {
		if got := closeCodeName(code); got != want {
			t.Errorf("closeCodeName(%d) = %q, want %q", code, got, want)
		}
	}
}

// BenchmarkTaskMetrics is the metric work one task adds to the hub's hot path: the
// counters and histograms of a submission, an assignment and a completed result.
func BenchmarkTaskMetrics(b *testing.B) {
	h, err := newHub(Config{}.WithDefaults())
	if err != nil {
		b.Fatal(err)
	}
	m := h.met
	labels := []string{"label-1", "label-2", "label-3", "label-4", "label-5"}
	recs := make([]taskRecord, len(labels))
	for i := range recs {
		recs[i].sched.Label = labels[i]
	}
	res := &pb.TaskResult{Ok: true}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rec := &recs[i%len(recs)]
		rec.metrics = nil // a fresh task resolves its label once
		m.of(rec).received.Inc()
		m.scheduled(m.scheduleStart())
		m.queueWait.Observe(0.001)
		m.scheduled(m.scheduleStart())
		m.result(rec, res, 0)
		m.completedTask(rec, time.Millisecond)
	}
}

// A connection refused at its hello (an old agent's protocol version, or no hello in
// time) counts in worker_disconnects_total, as README lists: an alert for old agents
// after an upgrade depends on it. The count comes before the close frame, so the
// worker seeing the close is enough to read it.
func TestDisconnectsAtHelloAreCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{HelloTimeout: 100 * time.Millisecond})
	old := b.dialRaw("old")
	old.write(&pb.Envelope{Body: &pb.Envelope_Hello{Hello: &pb.Hello{WorkerId: "old", MaxLabels: 1, Slots: 1}}})
	if code, _ := old.closeCode(); code != int(pb.CloseCode_CLOSE_CODE_PROTOCOL_VERSION) {
		t.Fatalf("close code %d for an old protocol version", code)
	}
	if code, _ := b.dialRaw("silent").closeCode(); code != int(pb.CloseCode_CLOSE_CODE_HELLO_TIMEOUT) {
		t.Fatalf("close code %d for no hello", code)
	}
	m := b.d.hub.met.disconnects
	if pv, ht := testutil.ToFloat64(m.WithLabelValues("protocol_version")), testutil.ToFloat64(m.WithLabelValues("hello_timeout")); pv != 1 || ht != 1 {
		t.Errorf("worker_disconnects_total{code=protocol_version} = %v, {code=hello_timeout} = %v; want 1 each", pv, ht)
	}
}

// A worker refused after a valid hello because shutdown began is closed with SHUTDOWN
// and counted, as one refused at its hello is.
func TestWorkerRefusedAtShutdownIsCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.d.hub.beginShutdown()
	w := b.dialRaw("late")
	w.write(&pb.Envelope{Body: &pb.Envelope_Hello{Hello: &pb.Hello{ProtocolVersion: frame.ProtocolVersion, WorkerId: "late", MaxLabels: 1, Slots: 1}}})
	// The close is the first frame: no Welcome for a worker that is not registered.
	w.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, data, err := w.ws.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != int(pb.CloseCode_CLOSE_CODE_SHUTDOWN) {
		t.Fatalf("first frame %q, %v; want the SHUTDOWN close and no Welcome", data, err)
	}
	if n := testutil.ToFloat64(b.d.hub.met.disconnects.WithLabelValues("shutdown")); n != 1 {
		t.Errorf("worker_disconnects_total{code=shutdown} = %v, want 1", n)
	}
}

// An EVICTED event for a label the worker never held (a made-up name, or a load the
// agent gave up before making it) is no eviction: it had minted a per-label series for
// good, and 500 of them pushed every real label's metrics into "other".
func TestEvictedLabelNeverHeldIsNotCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w := b.dial("w1", "m")
	ans := b.postAsync(`{"task_id":"ev-1","task_type":"x","label":"m"}`)
	a := w.assignment()
	for i := range 3 {
		w.write(&pb.Envelope{Body: &pb.Envelope_LabelEvent{LabelEvent: &pb.LabelEvent{
			Kind: pb.LabelEvent_KIND_EVICTED, Label: fmt.Sprintf("never-held-%d", i)}}})
	}
	w.finish(a, true, `"ok"`) // frames are handled in order: the events are in once it is answered
	if got := await(t, ans); got.status != 200 {
		t.Fatalf("answer %v", got)
	}
	b.d.hub.mu.Lock()
	defer b.d.hub.mu.Unlock()
	for name := range b.d.hub.met.byLabel {
		if strings.HasPrefix(name, "never-held") {
			t.Errorf("metric series made for %q, a label the worker never held", name)
		}
	}
	if n := testutil.ToFloat64(b.d.hub.met.evictions.WithLabelValues("m")); n != 0 {
		t.Errorf("evictions{m} = %v", n)
	}
}

// A load or run time a worker reports is kept within 0 and 24 h: a huge one wrapped
// when made a time.Duration, into the task's load_ms and the learned estimates.
func TestReportedDurationsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	w := b.dial("w1")
	ans := b.postAsync(`{"task_id":"rd-1","task_type":"x","label":"m"}`)
	w.result(w.assignment(), true, true, math.MaxInt64/1000*999) // wraps negative as µs × 1000
	got := await(t, ans)
	if got.status != 200 || got.body["load_ms"] != float64(24*time.Hour/time.Millisecond) {
		t.Fatalf("answer %v with load_ms %v, want 200 with 24 h", got.status, got.body["load_ms"])
	}
	if n, sum := histogram(t, b.d.hub.met.loadDuration); n != 1 || sum != (24*time.Hour).Seconds() {
		t.Errorf("load_duration_seconds: %d samples of sum %v, want one of 86400", n, sum)
	}
}
