package sim

import (
	"encoding/json"
	"testing"

	"github.com/smartroute/smartroute/worker-agent/backend"
)

// The hand-written echo is byte for byte encoding/json's.
func TestResultEncoding(t *testing.T) {
	t.Parallel()
	for _, task := range []backend.Task{
		{ID: "t-1", Type: "sample_task", Label: "label-1", Params: []byte(`{"data": "sample"}`)},
		{ID: "t-2", Type: "x", Label: "m", Params: []byte("a\\b\"c <&> \x01 é \xff")},
		{ID: "t-3", Type: "x", Label: "m", Params: []byte(`printable \ "quoted" only`)},
		{},
	} {
		want, _ := json.Marshal(result{TaskID: task.ID, TaskType: task.Type, Label: task.Label, WorkerID: "w-1", ParametersJSON: string(task.Params)})
		if got := appendResult(nil, task, "w-1"); string(got) != string(want) {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	}
}

func FuzzResultEncoding(f *testing.F) {
	f.Add("t-1", "label", []byte(`{"data": "sample"}`))
	f.Fuzz(func(t *testing.T, id, label string, params []byte) {
		task := backend.Task{ID: id, Type: "x", Label: label, Params: params}
		want, _ := json.Marshal(result{TaskID: id, TaskType: "x", Label: label, WorkerID: "w", ParametersJSON: string(params)})
		if got := appendResult(nil, task, "w"); string(got) != string(want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	})
}

// Every task a simulated fleet runs is encoded here (the throughput benchmark's echo).
func BenchmarkResultEncoding(b *testing.B) {
	task := backend.Task{ID: "wrk-1-12345", Type: "sample_task", Label: "label-3", Params: []byte(`{"data": "sample"}`)}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendResult(buf[:0], task, "tp-1")
	}
}
