package logcollector

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	pb "github.com/smartroute/smartroute/proto/smartroutev1"
)

// waitStreams polls the connected-streams gauge until it is want, bounded in time.
func waitStreams(t *testing.T, m *metrics, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mfs, err := m.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "smartroute_collector_connected_streams" && mf.GetMetric()[0].GetGauge().GetValue() == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("connected streams never reached %v", want)
		}
		time.Sleep(time.Millisecond)
	}
}

// A known sequence of batches over real streams: written batches and records,
// a duplicate, a write error, and the connected streams as they come and go.
func TestCollectorMetricsAfterKnownBatches(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	m := r.c.met
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	b, _ := connect(t, r.ingestURL(), "w2", "s1")
	waitStreams(t, m, 2)
	a.batch(1, 0, `{"n":1}`, `{"n":2}`)
	a.batch(1, 0, `{"n":1}`, `{"n":2}`) // resent: acknowledged, not written
	a.batch(2, 0, `{"n":3}`)
	b.batch(1, 0, `{"n":1}`)

	// Swap w2's file for a read-only handle on it, so that the next write fails: the
	// stream is closed and the batch not acknowledged.
	w, err := r.c.store.worker("w2")
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	ro, err := os.Open(w.dataPath(w.state.File))
	if err == nil {
		_ = w.file.Close()
		w.file = ro
	}
	w.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	b.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: &pb.LogBatch{Seq: 2, Records: [][]byte{[]byte(`{"n":2}`)}}}})
	if code := b.closeCode(); code != 1011 {
		t.Fatalf("close code %d after a write error, want 1011", code)
	}
	waitStreams(t, m, 1)

	for name, c := range map[string]struct {
		got  float64
		want float64
	}{
		"batches":    {testutil.ToFloat64(m.batches), 3},
		"records":    {testutil.ToFloat64(m.records), 4},
		"duplicates": {testutil.ToFloat64(m.duplicates), 1},
		"write errs": {testutil.ToFloat64(m.writeErrs), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", name, c.got, c.want)
		}
	}

	code, body := r.get("/metrics")
	if code != 200 {
		t.Fatalf("GET /metrics: %d", code)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
	for _, name := range []string{"smartroute_collector_batches_total", "smartroute_collector_records_total",
		"smartroute_collector_duplicate_batches_total", "smartroute_collector_write_errors_total",
		"smartroute_collector_budget_deleted_files_total", "smartroute_collector_batch_slot_waits_total",
		"smartroute_collector_queries_refused_total",
		"smartroute_collector_connected_streams", "go_goroutines"} {
		if families[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if got := families["smartroute_collector_records_total"].GetMetric()[0].GetCounter().GetValue(); got != 4 {
		t.Errorf("records over HTTP = %v, want 4", got)
	}
}

// A batch whose state.json was renamed into place while the directory fsync failed is
// in the file, and is acknowledged (welcome last_seq) once an fsync works: it counts
// as written then, once, and its resend as a duplicate.
func TestBatchWrittenWithUnsyncedStateCountsOnceVouchedFor(t *testing.T) {
	t.Parallel()
	r := startCollector(t, Config{})
	m := r.c.met
	a, _ := connect(t, r.ingestURL(), "w1", "s1")
	a.batch(1, 0, `{"n":1}`)
	failing := failDirSync(t, r, "w1")
	a.send(&pb.LogEnvelope{Body: &pb.LogEnvelope_Batch{Batch: &pb.LogBatch{Seq: 2,
		Records: [][]byte{[]byte(`{"n":2}`), []byte(`{"n":3}`), []byte(`{"n":4}`)}}}})
	if code := a.closeCode(); code != websocket.CloseInternalServerErr {
		t.Fatalf("close code %d", code)
	}
	if b, rec := testutil.ToFloat64(m.batches), testutil.ToFloat64(m.records); b != 1 || rec != 1 {
		t.Fatalf("before the state is vouched for: batches_total=%v records_total=%v, want 1 and 1", b, rec)
	}
	failing.Store(false)
	b, last := connect(t, r.ingestURL(), "w1", "s1")
	if last != 2 {
		t.Fatalf("welcome last_seq %d, want 2", last)
	}
	b.batch(2, 0, `{"n":2}`, `{"n":3}`, `{"n":4}`) // resent all the same
	if got := lines(t, r.dir, "w1"); len(got) != 4 {
		t.Fatalf("lines %q, want 4", got)
	}
	for name, c := range map[string]struct{ got, want float64 }{
		"batches":    {testutil.ToFloat64(m.batches), 2},
		"records":    {testutil.ToFloat64(m.records), 4},
		"duplicates": {testutil.ToFloat64(m.duplicates), 1},
		"write errs": {testutil.ToFloat64(m.writeErrs), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", name, c.got, c.want)
		}
	}
}
