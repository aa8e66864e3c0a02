package workerlog

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// The summary is read from log files that a crash may have cut anywhere: no line
// panics it, its counts never exceed the records it read, and reading one file or the
// same lines split across two readers gives the same summary.
func FuzzSummarize(f *testing.F) {
	for _, name := range []string{"bench-worker-1.log", "bench-worker-2.log"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:min(len(b), 4096)], uint16(len(b)/2))
	}
	f.Add([]byte(`{"event":"task_completed","worker_id":"w","task_id":"t","label_miss":true,"ok":false}`+"\n"+
		`{"event":"label_miss","worker_id":"w","task_id":"t","attempt":2}`), uint16(1))
	// The collector's notes of lost records.
	f.Add([]byte(`{"worker_id":"w","event":"log_records_dropped","dropped":9223372036854775807}`+"\n"+
		`{"worker_id":"w","event":"log_records_dropped","dropped":2}`+"\n"+
		`{"worker_id":"w","event":"log_batches_missing","missing_from":3,"missing_to":7}`), uint16(70))
	// A task run twice (its first result lost with the connection).
	f.Add([]byte(`{"event":"task_completed","worker_id":"w1","task_id":"t","attempt":1,"total_ms":50,"ok":true}`+"\n"+
		`{"event":"task_completed","worker_id":"w2","task_id":"t","attempt":2,"total_ms":0.1,"ok":true}`+"\n"+
		`{"event":"task_completed","worker_id":"w2","task_id":"u","total_ms":1e300,"ok":true}`), uint16(90))
	f.Fuzz(func(t *testing.T, logs []byte, cut uint16) {
		whole, err := Summarize(bytes.NewReader(logs))
		if err != nil {
			t.Skip() // a line over maxLine cannot be built from a fuzz input this size
		}
		if whole.LabelMisses > whole.Records || whole.TasksCompleted+whole.TasksFailed+whole.TasksRerun > whole.Records {
			t.Fatalf("counts exceed records: %+v", whole)
		}
		if whole.LogRecordsDropped < 0 || whole.LogBatchesMissing < 0 {
			t.Fatalf("lost records wrapped below zero: %+v", whole)
		}
		// Split at a line boundary: the second reader starts a line.
		i := min(int(cut), len(logs))
		if j := bytes.IndexByte(logs[i:], '\n'); j >= 0 {
			i += j + 1
		} else {
			i = len(logs)
		}
		split, err := Summarize(bytes.NewReader(logs[:i]), bytes.NewReader(logs[i:]))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(whole, split) {
			t.Fatalf("split at %d:\n whole %+v\n split %+v", i, whole, split)
		}
	})
}
