package agent_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
	"github.com/smartroute/smartroute/worker-agent/agent"
	"github.com/smartroute/smartroute/worker-agent/backend/backendtest"
	"github.com/smartroute/smartroute/worker-agent/backend/triton/fake"
)

// metricValue is the value of a counter or gauge, or the sample count of a histogram,
// whose labels include want; -1 when there is no such series.
func metricValue(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := want[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

// waitMetric polls until a metric holds want, bounded by waitLimit.
func waitMetric(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for metricValue(t, g, name, labels) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v, want %v", name, labels, metricValue(t, g, name, labels), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// A known sequence against the scripted dispatcher: a load, a hit, a failed load, a
// task past its deadline, a refusal; the counters and histograms hold each.
func TestAgentMetricsAfterKnownTasks(t *testing.T) {
	t.Parallel()
	m := agent.NewMetrics()
	f := backendtest.New()
	f.OnLoad = func(_ context.Context, label string) error {
		if label == "bad" {
			return errors.New("model file missing")
		}
		return nil
	}
	h := setup(t, withFake(f), withConfig(func(c *agent.Config) { c.Metrics = m; c.HealthInterval = time.Millisecond }))
	reg := m.Registry()
	p := h.connect()
	waitMetric(t, reg, "smartroute_agent_connected", nil, 1)

	if r := p.run("t1", "a", ""); !r.GetOk() || !r.GetLabelMiss() {
		t.Fatalf("t1 %v", r)
	}
	if r := p.run("t2", "a", ""); !r.GetOk() || r.GetLabelMiss() {
		t.Fatalf("t2 %v", r)
	}
	if r := p.run("t3", "bad", ""); r.GetOk() {
		t.Fatalf("t3 %v", r)
	}
	p.assign(&pb.TaskAssignment{TaskId: "t4", TaskType: "x", Label: "a", DeadlineUnixMs: time.Now().Add(-time.Second).UnixMilli()})
	if r := p.result(); !r.GetDeadlineExceeded() {
		t.Fatalf("t4 %v", r)
	}
	f.SetHealth(errors.New("gpu gone"))
	if st := p.status(); st.GetAccepting() {
		t.Fatalf("status %v, want not accepting", st)
	}
	if r := p.run("t5", "a", ""); !r.GetRefused() {
		t.Fatalf("t5 %v", r)
	}

	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"smartroute_agent_tasks_total", map[string]string{"result": "ok"}, 2},
		{"smartroute_agent_tasks_total", map[string]string{"result": "error"}, 1},
		{"smartroute_agent_tasks_total", map[string]string{"result": "deadline"}, 1},
		{"smartroute_agent_tasks_total", map[string]string{"result": "refused"}, 1},
		{"smartroute_agent_tasks_total", map[string]string{"result": "discarded"}, 0},
		{"smartroute_agent_label_loads_total", map[string]string{"label": "a", "result": "ok"}, 1},
		{"smartroute_agent_label_loads_total", map[string]string{"label": "bad", "result": "failed"}, 1},
		{"smartroute_agent_load_duration_seconds", nil, 2},
		{"smartroute_agent_run_duration_seconds", nil, 2}, // t1 and t2 reached the backend
		{"smartroute_agent_log_records_dropped_total", nil, 0},
		{"smartroute_agent_connected", nil, 1},
	} {
		if got := metricValue(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got := metricValue(t, reg, "smartroute_agent_connected", nil); got != 0 {
		t.Errorf("connected after Run returned = %v, want 0", got)
	}
}

// Failed Triton calls are counted by operation.
func TestAgentMetricsCountTritonErrors(t *testing.T) {
	t.Parallel()
	m := agent.NewMetrics()
	f := fake.New(fake.Config{Models: []string{"a"}})
	f.FailLoads("a", "failing on purpose")
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) { c.Metrics = m }))
	p := h.connect()
	if r := runTyped(p, "t1", "infer", "a", inferParams); r.GetOk() {
		t.Fatalf("result %v, want the load failure", r)
	}
	if got := metricValue(t, m.Registry(), "smartroute_agent_triton_errors_total", map[string]string{"op": "load"}); got != 1 {
		t.Errorf("triton load errors = %v, want 1", got)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// Every series an alert's increase() reads exists at 0 before its first event: a
// counter that appears at 1 shows no increase, so a label whose loads fail on every
// agent once would never alert.
func TestAgentMetricsSeriesExistBeforeTheirFirstEvent(t *testing.T) {
	t.Parallel()
	m := agent.NewMetrics()
	f := fake.New(fake.Config{Models: []string{"a", "b"}})
	h := setup(t, withTriton(t, f), withConfig(func(c *agent.Config) { c.Metrics = m }))
	p := h.connect()
	reg := m.Registry()
	for _, label := range []string{"a", "b"} {
		for _, result := range []string{"ok", "failed"} {
			want := map[string]string{"label": label, "result": result}
			if got := metricValue(t, reg, "smartroute_agent_label_loads_total", want); got != 0 {
				t.Errorf("label_loads_total%v = %v before any load, want 0", want, got)
			}
		}
	}
	for _, op := range []string{"load", "unload", "infer", "index", "live", "ready"} {
		want := map[string]string{"op": op}
		if got := metricValue(t, reg, "smartroute_agent_triton_errors_total", want); got != 0 {
			t.Errorf("triton_errors_total%v = %v before any call failed, want 0", want, got)
		}
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// /healthz is the process's liveness; /readyz follows the connection and the backend;
// /metrics is Prometheus text; pprof is there only when asked for.
func TestAgentOpsEndpoints(t *testing.T) {
	t.Parallel()
	m := agent.NewMetrics()
	ops := httptest.NewServer(m.Handler(true))
	defer ops.Close()
	plain := httptest.NewServer(m.Handler(false))
	defer plain.Close()

	if code, body := get(t, ops.URL+"/readyz"); code != 503 || !strings.Contains(body, "no agent running") {
		t.Errorf("readyz with no agent: %d %q", code, body)
	}
	f := backendtest.New()
	h := setup(t, withFake(f), withConfig(func(c *agent.Config) { c.Metrics = m; c.HealthInterval = time.Millisecond }))
	waitReady := func(wantCode int, wantBody string) {
		t.Helper()
		deadline := time.Now().Add(waitLimit)
		for {
			code, body := get(t, ops.URL+"/readyz")
			if code == wantCode && strings.Contains(body, wantBody) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("readyz %d %q, want %d with %q", code, body, wantCode, wantBody)
			}
			time.Sleep(time.Millisecond)
		}
	}
	p := h.connect()
	waitReady(200, "ready")
	f.SetHealth(errors.New("gpu gone"))
	waitReady(503, "gpu gone")
	if code, _ := get(t, ops.URL+"/healthz"); code != 200 {
		t.Errorf("healthz while the backend is down: %d, want 200", code)
	}
	f.SetHealth(nil)
	waitReady(200, "ready")

	resp, err := http.Get(ops.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
	for _, name := range []string{"smartroute_agent_tasks_total", "smartroute_agent_connected",
		"smartroute_agent_log_records_dropped_total", "go_goroutines", "process_cpu_seconds_total"} {
		if families[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if code, _ := get(t, ops.URL+"/debug/pprof/"); code != 200 {
		t.Errorf("pprof index with pprof on: %d", code)
	}
	if code, _ := get(t, plain.URL+"/debug/pprof/"); code != 404 {
		t.Errorf("pprof index with pprof off: %d, want 404", code)
	}
	if err := h.stop(p); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if code, body := get(t, ops.URL+"/readyz"); code != 503 {
		t.Errorf("readyz after the agent stopped: %d %q", code, body)
	}
}

// Connected means welcomed: a dispatcher (or a proxy before it) that took the upgrade
// and never answers the hello gives no tasks, and /readyz said ready for the whole
// handshake timeout, at every retry.
func TestReadyzWaitsForTheWelcome(t *testing.T) {
	t.Parallel()
	m := agent.NewMetrics()
	h := setup(t, withConfig(func(c *agent.Config) { c.Metrics = m }))
	p := h.accept()
	if p.read().GetHello() == nil { // the hello is out; no Welcome is sent yet
		t.Fatal("first frame is not a hello")
	}
	rec := httptest.NewRecorder()
	m.Handler(false).ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "not connected") {
		t.Fatalf("readyz %d %q before the Welcome, want 503 not connected", rec.Code, strings.TrimSpace(rec.Body.String()))
	}
	if got := metricValue(t, m.Registry(), "smartroute_agent_connected", nil); got != 0 {
		t.Fatalf("smartroute_agent_connected = %v before the Welcome, want 0", got)
	}
}

// RunMany serves the ops endpoints on MetricsAddr and refuses an address it cannot
// listen on before starting any agent.
func TestRunManyMetricsAddr(t *testing.T) {
	t.Parallel()
	err := agent.RunMany(t.Context(), agent.Config{MetricsAddr: "127.0.0.1:-1", LogOutput: io.Discard}, 2)
	if err == nil || !strings.Contains(err.Error(), "MetricsAddr") {
		t.Fatalf("RunMany = %v, want an error naming MetricsAddr", err)
	}
}
