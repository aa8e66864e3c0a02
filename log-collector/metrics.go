package logcollector

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the collector's Prometheus collectors, on a registry of its own so that
// tests with many collectors do not collide.
type metrics struct {
	reg        *prometheus.Registry
	batches    prometheus.Counter
	records    prometheus.Counter
	duplicates prometheus.Counter
	writeErrs  prometheus.Counter
	// budgetDeletes counts files trimToBudget deleted.
	budgetDeletes prometheus.Counter
	batchWaits    prometheus.Counter
	// queriesRefused counts GET /logs answered 503 for MaxActiveQueries.
	queriesRefused prometheus.Counter
}

func newMetrics(c *Collector) *metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "smartroute_collector_" + name, Help: help})
	}
	m := &metrics{
		reg: prometheus.NewRegistry(),
		batches: counter("batches_total",
			"Log batches written, each counted once, when durable (a batch whose ack was lost counts here, its resend in duplicate_batches_total)."),
		records:    counter("records_total", "Log records written, in the batches counted by batches_total."),
		duplicates: counter("duplicate_batches_total", "Batches acknowledged without writing: already written (resent after a lost ack)."),
		writeErrs:  counter("write_errors_total", "Batches that could not be written to disk; their stream is closed and the agent resends."),
		budgetDeletes: counter("budget_deleted_files_total",
			"Log files deleted to keep all workers' files within --max-total-bytes: rotated-out files, and gone workers' current files."),
		batchWaits: counter("batch_slot_waits_total",
			"Batches that waited for one of the --max-active-batches slots; often rising means the collector is the bottleneck."),
		queriesRefused: counter("queries_refused_total",
			"GET /logs queries answered 503 because --max-active-queries were running."),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.batches, m.records, m.duplicates, m.writeErrs, m.budgetDeletes, m.batchWaits, m.queriesRefused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "smartroute_collector_connected_streams",
			Help: "Agent log streams connected now."}, func() float64 {
			c.mu.Lock()
			defer c.mu.Unlock()
			return float64(len(c.streams))
		}),
	)
	return m
}
