package dispatcher

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// otherLabel is the label value that labels past Config.MetricsMaxLabels share.
const otherLabel = "other"

// scheduleSampleEvery: one scheduler call in this many is timed. Two clock reads cost
// about as much as a scheduler decision on a hit; a sample keeps the distribution.
const scheduleSampleEvery = 8

// failReason is the reason label of smartroute_dispatcher_tasks_failed_total: a small
// fixed set, so that error texts never become series.
type failReason uint8

const (
	failDeadline        failReason = iota // deadline passed, queued or running (504)
	failWorkerError                       // the worker ran the task and reported an error (502)
	failWorkersLost                       // the task's workers were lost, or refused it, MaxAttempts times (503)
	failShutdown                          // the dispatcher shut down before the task finished (503)
	failLoad                              // the label failed to load on every worker tried (502)
	failLabelFailing                      // the label is marked failing (503)
	failNoWorkerCanLoad                   // no connected worker can load the label (503)
	failWorkerOverran                     // the worker overran the deadline by overrunGrace without answering (504)
	numFailReasons
)

var failReasonNames = [numFailReasons]string{"deadline", "worker_error", "workers_lost", "shutdown", "load_failed", "label_failing", "no_worker_can_load", "worker_overran"}

// failReasonOf maps a scheduler failure to its metric reason.
func failReasonOf(r scheduler.FailReason) failReason {
	switch r {
	case scheduler.FailAttempts:
		return failWorkersLost
	case scheduler.FailLoad:
		return failLoad
	case scheduler.FailLabelFailing:
		return failLabelFailing
	case scheduler.FailNoWorkerCanLoad:
		return failNoWorkerCanLoad
	case scheduler.FailOverrun:
		return failWorkerOverran
	}
	return failDeadline
}

// labelMetrics are one label's counters, resolved once so that the per-task path is a
// few atomic adds: no label lookup in a vec, no varargs slice.
type labelMetrics struct {
	received, completed, hits, loads, evictions prometheus.Counter
	failed                                      [numFailReasons]prometheus.Counter // created on first use
}

// metrics are the dispatcher's Prometheus collectors, on a registry of its own so that
// many dispatchers in one process (tests) do not collide.
type metrics struct {
	reg       *prometheus.Registry
	maxLabels int

	// byLabel caches the children of each label seen, up to maxLabels; the rest share
	// other. Guarded by hub.mu, like the task records that point into it.
	byLabel map[string]*labelMetrics
	other   *labelMetrics
	// scheduleTick counts scheduler calls for sampling; guarded by hub.mu. Tests set
	// scheduleEvery to 1 to time every call.
	scheduleTick, scheduleEvery uint32

	received, completed, failed, hits, loads, evictions *prometheus.CounterVec
	queueWait, taskDuration, loadDuration, schedule     prometheus.Histogram
	connects                                            prometheus.Counter
	disconnects                                         *prometheus.CounterVec
	journalWriteErrors                                  prometheus.Counter
}

func newMetrics(h *hub, maxLabels int) *metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "smartroute_dispatcher_" + name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "smartroute_dispatcher_" + name, Help: help, Buckets: buckets})
	}
	// Task latencies span a hit answered in a millisecond to a queue behind loads.
	taskBuckets := prometheus.ExponentialBuckets(0.001, 2.5, 14) // 1ms .. ~150s
	m := &metrics{
		reg:           prometheus.NewRegistry(),
		maxLabels:     maxLabels,
		byLabel:       make(map[string]*labelMetrics),
		scheduleEvery: scheduleSampleEvery,
		received:      counter("tasks_received_total", "Tasks accepted by POST /run-task (resubmitted ids and refusals not counted).", "label"),
		completed:     counter("tasks_completed_total", "Tasks answered with a worker's successful result.", "label"),
		failed:        counter("tasks_failed_total", "Tasks answered with a failure, by reason: deadline, worker_error, workers_lost, shutdown, load_failed, label_failing, no_worker_can_load, worker_overran.", "label", "reason"),
		hits:          counter("label_hits_total", "Tasks completed on a worker that already held their label.", "label"),
		loads:         counter("label_loads_total", "Task results that report a label load (label misses).", "label"),
		evictions:     counter("evictions_total", "Labels workers unloaded, by the evicted label.", "label"),
		queueWait:     histogram("queue_wait_seconds", "Time from submission to the start of each attempt on a worker.", taskBuckets),
		taskDuration:  histogram("task_duration_seconds", "Time from submission to the answer of completed tasks.", taskBuckets),
		loadDuration: histogram("load_duration_seconds", "Label load times that workers reported with their results.",
			prometheus.ExponentialBuckets(0.01, 2, 14)), // 10ms .. ~80s
		schedule: histogram("schedule_duration_seconds", "Time the scheduler takes to route a submitted task or a completed one (one call in 8 sampled).",
			prometheus.ExponentialBuckets(1e-7, 3, 12)), // 100ns .. ~18ms
		connects: prometheus.NewCounter(prometheus.CounterOpts{Name: "smartroute_dispatcher_worker_connects_total",
			Help: "Worker connections registered after their hello."}),
		disconnects: counter("worker_disconnects_total", "Worker connections ended, by close code (shutdown, replaced, slow_worker, bad_frame, normal, unspecified, ...).", "code"),
		journalWriteErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "smartroute_dispatcher_journal_write_errors_total",
			Help: "Failed writes of task answers to the journal (disk full or failing); the answers are kept and written again."}),
	}
	m.other = m.newLabel(otherLabel)
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.received, m.completed, m.failed, m.hits, m.loads, m.evictions,
		m.queueWait, m.taskDuration, m.loadDuration, m.schedule, m.connects, m.disconnects, m.journalWriteErrors,
		&hubCollector{h: h, m: m},
	)
	return m
}

func (m *metrics) newLabel(name string) *labelMetrics {
	return &labelMetrics{
		received:  m.received.WithLabelValues(name),
		completed: m.completed.WithLabelValues(name),
		hits:      m.hits.WithLabelValues(name),
		loads:     m.loads.WithLabelValues(name),
		evictions: m.evictions.WithLabelValues(name),
	}
}

// label returns a label's counters; past maxLabels distinct labels, the shared
// "other" ones. Caller holds hub.mu.
func (m *metrics) label(name string) *labelMetrics {
	if lm := m.byLabel[name]; lm != nil {
		return lm
	}
	if len(m.byLabel) >= m.maxLabels || name == otherLabel {
		return m.other
	}
	lm := m.newLabel(name)
	m.byLabel[name] = lm
	return lm
}

// of returns the counters of a task's label, cached on the record. Caller holds hub.mu.
func (m *metrics) of(rec *taskRecord) *labelMetrics {
	if rec.metrics == nil {
		rec.metrics = m.label(rec.sched.Label)
	}
	return rec.metrics
}

// scheduleStart is when a scheduler call starts, for the sampled calls; the zero time
// for the others. Caller holds hub.mu.
func (m *metrics) scheduleStart() time.Time {
	m.scheduleTick++
	if m.scheduleTick%m.scheduleEvery != 0 {
		return time.Time{}
	}
	return time.Now()
}

// scheduled records how long a sampled scheduler call took since start.
func (m *metrics) scheduled(start time.Time) {
	if !start.IsZero() {
		m.schedule.Observe(time.Since(start).Seconds())
	}
}

// result counts a label load or hit from a worker's result. Caller holds hub.mu.
func (m *metrics) result(rec *taskRecord, res *pb.TaskResult, loadTime time.Duration) {
	lm := m.of(rec)
	switch {
	case res.GetLabelMiss():
		lm.loads.Inc()
		m.loadDuration.Observe(loadTime.Seconds())
	case res.GetOk():
		lm.hits.Inc()
	}
}

// completedTask counts a task answered with success after took. Caller holds hub.mu.
func (m *metrics) completedTask(rec *taskRecord, took time.Duration) {
	m.of(rec).completed.Inc()
	m.taskDuration.Observe(took.Seconds())
}

// failedTask counts a task answered with a failure. Caller holds hub.mu.
func (m *metrics) failedTask(rec *taskRecord, r failReason) {
	lm := m.of(rec)
	if lm.failed[r] == nil {
		name := otherLabel
		if lm != m.other {
			name = rec.sched.Label
		}
		lm.failed[r] = m.failed.WithLabelValues(name, failReasonNames[r])
	}
	lm.failed[r].Inc()
}

// disconnected counts a worker connection that ended with code.
func (m *metrics) disconnected(code pb.CloseCode) {
	m.disconnects.WithLabelValues(closeCodeName(code)).Inc()
}

// closeCodeName is the code label of a close code: the protocol's codes by name, the
// common WebSocket ones by meaning, anything else "other", so a worker cannot mint
// series by sending odd codes.
func closeCodeName(code pb.CloseCode) string {
	switch code {
	case 1000:
		return "normal"
	case 1001:
		return "going_away"
	case 1006:
		return "abnormal"
	}
	if name, ok := pb.CloseCode_name[int32(code)]; ok {
		return strings.ToLower(strings.TrimPrefix(name, "CLOSE_CODE_"))
	}
	return "other"
}

// hubCollector reads the gauges from the hub at scrape time, so that queueing and
// connecting cost nothing extra. It holds hub.mu for O(labels tracked) map reads.
type hubCollector struct {
	h *hub
	m *metrics
}

var (
	queuedDesc = prometheus.NewDesc("smartroute_dispatcher_queued_tasks",
		"Tasks waiting for a worker, by label (labels past --metrics-max-labels are \"other\").", []string{"label"}, nil)
	queuedTotalDesc = prometheus.NewDesc("smartroute_dispatcher_queued_tasks_total",
		"Tasks waiting for a worker, all labels: the signal to scale workers on.", nil, nil)
	inflightDesc = prometheus.NewDesc("smartroute_dispatcher_inflight_tasks",
		"Tasks assigned to a worker and not answered yet.", nil, nil)
	connectedDesc = prometheus.NewDesc("smartroute_dispatcher_connected_workers",
		"Workers connected now.", nil, nil)
	unwrittenDesc = prometheus.NewDesc("smartroute_dispatcher_journal_unwritten_answers",
		"Answers of journaled tasks waiting to be written to the journal (with --data-dir); above zero for long, the disk is failing.", nil, nil)
)

func (c *hubCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queuedDesc
	ch <- queuedTotalDesc
	ch <- inflightDesc
	ch <- connectedDesc
	ch <- unwrittenDesc
}

func (c *hubCollector) Collect(ch chan<- prometheus.Metric) {
	type labelQueued struct {
		label string
		n     int
	}
	c.h.mu.Lock()
	total := c.h.sched.QueuedTasks()
	inflight := len(c.h.active) - total // every active task is queued or on a worker
	connected := len(c.h.workers)
	perLabel := make([]labelQueued, 0, len(c.m.byLabel))
	own := 0
	for label := range c.m.byLabel {
		n := c.h.sched.Queued(label)
		own += n
		perLabel = append(perLabel, labelQueued{label, n})
	}
	c.h.mu.Unlock()
	// Send after unlocking: the registry reads the channel concurrently.
	for _, q := range perLabel {
		ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(q.n), q.label)
	}
	ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(total-own), otherLabel)
	ch <- prometheus.MustNewConstMetric(queuedTotalDesc, prometheus.GaugeValue, float64(total))
	ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(max(inflight, 0)))
	ch <- prometheus.MustNewConstMetric(connectedDesc, prometheus.GaugeValue, float64(connected))
	if j := c.h.journal; j != nil { // set once at start, before the server runs
		ch <- prometheus.MustNewConstMetric(unwrittenDesc, prometheus.GaugeValue, float64(j.unwritten()))
	}
}
