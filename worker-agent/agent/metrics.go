package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/smartroute/smartroute/worker-agent/logship"
)

// Task results as smartroute_agent_tasks_total counts them.
const (
	taskOK        = "ok"        // ran and succeeded
	taskError     = "error"     // ran (or its label failed to load) and failed
	taskDeadline  = "deadline"  // its deadline passed while it ran
	taskRefused   = "refused"   // never started (draining, backend down, no slot): runs elsewhere
	taskDiscarded = "discarded" // abandoned with its connection; the dispatcher re-queues it
)

// Metrics are the agent's Prometheus collectors and its readiness. The agents of one
// process (RunMany) share one Metrics: every series is the process's total, with no
// worker label, because in production a process runs one agent (a pod is the worker)
// and --agents N load tests want totals, not N copies of every histogram. All methods
// accept a nil *Metrics, so an agent without metrics pays nothing.
type Metrics struct {
	reg *prometheus.Registry

	labelLoads   *prometheus.CounterVec // label, result
	loadDuration prometheus.Histogram
	runDuration  prometheus.Histogram
	tasks        *prometheus.CounterVec // result
	tritonErrors *prometheus.CounterVec // op
	connected    prometheus.Gauge

	// mu guards agents and the log shippers, read at scrape and probe time.
	mu       sync.Mutex
	agents   map[*agent]struct{}
	shippers map[*logship.Shipper]struct{}
	retired  uint64 // records dropped by shippers already closed
}

// NewMetrics returns a Metrics with a registry of its own (Go and process collectors
// included), so that tests with many agents do not collide.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		labelLoads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "smartroute_agent_label_loads_total",
			Help: "Label loads this process started, by label and result (ok, failed)."}, []string{"label", "result"}),
		loadDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "smartroute_agent_load_duration_seconds",
			Help: "Time a label load took on the backend, failed loads included.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		runDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "smartroute_agent_run_duration_seconds",
			Help: "Time the backend took to run a task, label wait excluded.", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14)}),
		tasks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "smartroute_agent_tasks_total",
			Help: "Task attempts by result: ok, error, deadline, refused, discarded."}, []string{"result"}),
		tritonErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "smartroute_agent_triton_errors_total",
			Help: "Failed Triton calls by operation (load, unload, infer, index, live)."}, []string{"op"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "smartroute_agent_connected",
			Help: "Agents of this process connected to the dispatcher (0 or 1 for a single agent)."}),
		agents:   make(map[*agent]struct{}),
		shippers: make(map[*logship.Shipper]struct{}),
	}
	for _, r := range []string{taskOK, taskError, taskDeadline, taskRefused, taskDiscarded} {
		m.tasks.WithLabelValues(r) // every result is a series from the start, so rate() sees the first one
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.labelLoads, m.loadDuration, m.runDuration, m.tasks, m.tritonErrors, m.connected,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "smartroute_agent_log_records_dropped_total",
			Help: "Log records the log shipper dropped (buffer full, record too long) instead of sending to the log collector."},
			m.droppedRecords),
	)
	return m
}

// Registry is the registry /metrics serves.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

func (m *Metrics) labelLoaded(label string, err error, took time.Duration) {
	if m == nil {
		return
	}
	ok, failed := m.labelLoads.WithLabelValues(label, "ok"), m.labelLoads.WithLabelValues(label, "failed")
	if err != nil {
		failed.Inc()
	} else {
		ok.Inc()
	}
	m.loadDuration.Observe(took.Seconds())
}

// labelsSeen makes both result series of each label's loads, at 0, before its first
// load. increase() cannot see the step to a counter's first value, so without this a
// label whose every load fails would never reach SmartrouteLabelLoadsFailing: each
// agent's "failed" series would start at 1 and stay there until its next failure.
func (m *Metrics) labelsSeen(labels []string) {
	if m == nil {
		return
	}
	for _, l := range labels {
		m.labelLoads.WithLabelValues(l, "ok")
		m.labelLoads.WithLabelValues(l, "failed")
	}
}

// tritonOps makes a zero series for each Triton operation, for the same reason.
func (m *Metrics) tritonOps(ops []string) {
	if m == nil {
		return
	}
	for _, op := range ops {
		m.tritonErrors.WithLabelValues(op)
	}
}

func (m *Metrics) ran(took time.Duration) {
	if m != nil {
		m.runDuration.Observe(took.Seconds())
	}
}

func (m *Metrics) taskEnded(result string) {
	if m != nil {
		m.tasks.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) tritonError(op string) {
	if m != nil {
		m.tritonErrors.WithLabelValues(op).Inc()
	}
}

// sessionStarted marks s welcomed and counts a connected agent until s ends; false
// when s ended meanwhile. Call it before s's reader and writer start.
func (m *Metrics) sessionStarted(s *session) bool {
	if m == nil {
		return s.markWelcomed(nil)
	}
	m.connected.Inc()
	if !s.markWelcomed(m.connected.Dec) {
		m.connected.Dec()
		return false
	}
	return true
}

// track registers a running agent for /readyz and its shipper's drops; the returned
// func forgets it.
func (m *Metrics) track(a *agent) func() {
	if m == nil {
		return func() {}
	}
	m.mu.Lock()
	m.agents[a] = struct{}{}
	if a.logShip != nil {
		m.shippers[a.logShip] = struct{}{}
	}
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.agents, a)
		if a.logShip != nil {
			m.retired += a.logShip.Stats().Dropped
			delete(m.shippers, a.logShip)
		}
	}
}

func (m *Metrics) droppedRecords() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.retired
	for s := range m.shippers {
		n += s.Stats().Dropped
	}
	return float64(n)
}

// notReady lists why agents are not ready, sorted; empty means every agent is. No
// agent running at all is not ready either.
func (m *Metrics) notReady() []string {
	m.mu.Lock()
	agents := make([]*agent, 0, len(m.agents))
	for a := range m.agents {
		agents = append(agents, a)
	}
	m.mu.Unlock()
	if len(agents) == 0 {
		return []string{"no agent running"}
	}
	var out []string
	for _, a := range agents {
		if why := a.notReady(); why != "" {
			out = append(out, a.cfg.WorkerID+": "+why)
		}
	}
	sort.Strings(out)
	return out
}

// notReady says why the agent cannot take tasks now, or "" when it can.
func (a *agent) notReady() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.cur.Load() // once: the run loop clears it without a.mu
	switch {
	case a.draining:
		return "draining"
	case s == nil || !s.isWelcomed():
		return "not connected to the dispatcher"
	case !a.available:
		return a.unavailableReason
	}
	return ""
}

// Handler serves /metrics, /healthz (200 while the process runs: the agent's liveness,
// independent of the backend), /readyz (200 when every agent is connected and its
// backend available, else 503 with the reasons) and, with pprof, /debug/pprof/.
func (m *Metrics) Handler(withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := m.notReady(); len(why) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: "+strings.Join(why, "; "))
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// serveOps serves m.Handler on addr from now until stop is called, and returns the
// address it listens on; it fails only if addr cannot be listened on.
func serveOps(addr string, m *Metrics, withPprof bool) (stop func(), bound string, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("MetricsAddr (--metrics-addr): %w", err)
	}
	srv := &http.Server{Handler: m.Handler(withPprof), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-served // ErrServerClosed, or an accept error that ended serving earlier
	}, ln.Addr().String(), nil
}
