package report

import (
	"cmp"
	"encoding/json"
	"io"
	"maps"
	"math"
	"slices"
	"time"
)

// The JSON forms: times in seconds as floats, keys in snake_case.

type jsonSettings struct {
	Workers      int      `json:"workers"`
	MaxLabels    int      `json:"max_labels"`
	Slots        int      `json:"slots"`
	Requests     int      `json:"requests"`
	Producers    int      `json:"producers"`
	Labels       int      `json:"labels"`
	WaitAvgS     float64  `json:"wait_avg_s"`
	WaitStddevS  float64  `json:"wait_stddev_s"`
	SyncShare    float64  `json:"sync_share"`
	TimeScale    float64  `json:"time_scale"`
	Seed         int64    `json:"seed"`
	Backend      string   `json:"backend"`
	SimLoadTimeS float64  `json:"sim_load_time_s"`
	SimRunTimeS  *float64 `json:"sim_run_time_s,omitempty"` // none beside fake Tritons: runs are their inference
}

type jsonWorkerStats struct {
	LabelMisses    int `json:"label_misses"`
	TasksCompleted int `json:"tasks_completed"`
	TasksFailed    int `json:"tasks_failed"`
	TasksRerun     int `json:"tasks_rerun"`
	// LogRecordsDropped and LogBatchesMissing are the log collector's notes of lost
	// records (workerlog.Summary).
	LogRecordsDropped int `json:"log_records_dropped"`
	LogBatchesMissing int `json:"log_batches_missing"`
}

type jsonWorker struct {
	// The fleet's totals, as each worker's: TasksRerun counts the runs beyond each
	// task's last (workerlog.Summary.TasksRerun); the counts are short by the records
	// LogRecordsDropped and LogBatchesMissing say the collector lost.
	jsonWorkerStats
	AvgTaskRuntime float64 `json:"avg_task_runtime_s"`
	// AvgTaskRuntimeUnscaled is AvgTaskRuntime divided by the time scale.
	AvgTaskRuntimeUnscaled float64                    `json:"avg_task_runtime_unscaled_s"`
	AvgLoadTime            float64                    `json:"avg_load_time_s"`
	AvgRunTime             float64                    `json:"avg_run_time_s"`
	Workers                map[string]jsonWorkerStats `json:"workers"`
	LogLinesSkipped        int                        `json:"log_lines_skipped"`
}

type jsonLatency struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_s"`
	Min   float64 `json:"min_s"`
	P50   float64 `json:"p50_s"`
	P90   float64 `json:"p90_s"`
	P95   float64 `json:"p95_s"`
	P99   float64 `json:"p99_s"`
	Max   float64 `json:"max_s"`
}

type jsonProducer struct {
	Requests    int            `json:"requests"`
	Failed      int            `json:"failed"`
	Sync        int            `json:"sync"`
	Dispatched  int            `json:"dispatched"`
	Completed   int            `json:"completed"`
	LabelMisses int            `json:"label_misses"`
	Latency     jsonLatency    `json:"latency"`
	Throughput  float64        `json:"throughput_per_s"`
	Wall        float64        `json:"wall_s"`
	Errors      map[string]int `json:"errors,omitempty"`
}

type jsonResult struct {
	Mode     string       `json:"mode"`
	RunID    string       `json:"run_id"`
	OutDir   string       `json:"out_dir,omitempty"`
	Settings jsonSettings `json:"settings"`
	Worker   jsonWorker   `json:"worker"`
	Producer jsonProducer `json:"producer"`
	// EarlyExits are Result.EarlyExits: processes that died during the run.
	EarlyExits []string `json:"early_exits,omitempty"`
	Notes      []string `json:"notes,omitempty"`
}

// jsonRatio is a Ratio; Value is null when it is infinite or undefined, which JSON
// cannot carry.
type jsonRatio struct {
	Value *float64 `json:"value"`
	Text  string   `json:"text"`
}

type jsonComparison struct {
	Routing jsonResult           `json:"routing"`
	Random  jsonResult           `json:"random"`
	Ratios  map[string]jsonRatio `json:"ratios"`
}

func s(d time.Duration) float64 { return d.Seconds() }

func toJSON(r Result) jsonResult {
	st, ws, ps := r.Settings, r.Worker, r.Producer
	workers := map[string]jsonWorkerStats{}
	for _, id := range slices.Sorted(maps.Keys(ws.Workers)) {
		w := ws.Workers[id]
		workers[id] = jsonWorkerStats{w.LabelMisses, w.TasksCompleted, w.TasksFailed, w.TasksRerun, w.LogRecordsDropped, w.LogBatchesMissing}
	}
	l := ps.Latency
	var simRun *float64
	if st.Backend != BackendTriton {
		v := s(st.SimRunTime)
		simRun = &v
	}
	return jsonResult{
		Mode:   r.Mode,
		RunID:  r.RunID,
		OutDir: r.OutDir,
		Settings: jsonSettings{
			Workers: st.Workers, MaxLabels: st.MaxLabels, Slots: st.Slots,
			Requests: st.Requests, Producers: st.Producers, Labels: st.Labels,
			WaitAvgS: s(st.WaitAvg), WaitStddevS: s(st.WaitStddev),
			SyncShare: st.SyncShare, TimeScale: st.TimeScale, Seed: st.Seed,
			Backend: cmp.Or(st.Backend, "sim"), SimLoadTimeS: s(st.SimLoadTime), SimRunTimeS: simRun,
		},
		Worker: jsonWorker{
			jsonWorkerStats:        jsonWorkerStats{ws.LabelMisses, ws.TasksCompleted, ws.TasksFailed, ws.TasksRerun, ws.LogRecordsDropped, ws.LogBatchesMissing},
			AvgTaskRuntime:         s(ws.AvgTaskRuntime),
			AvgTaskRuntimeUnscaled: s(st.unscaledRuntime(ws)),
			AvgLoadTime:            s(ws.AvgLoadTime), AvgRunTime: s(ws.AvgRunTime),
			Workers: workers, LogLinesSkipped: ws.Skipped,
		},
		Producer: jsonProducer{
			Requests: ps.Requests, Failed: ps.Failed, Sync: ps.Sync, Dispatched: ps.Dispatched,
			Completed: ps.Completed, LabelMisses: ps.LabelMisses,
			Latency: jsonLatency{
				Count: l.Count, Mean: s(l.Mean), Min: s(l.Min), P50: s(l.P50), P90: s(l.P90),
				P95: s(l.P95), P99: s(l.P99), Max: s(l.Max),
			},
			Throughput: ps.Throughput, Wall: s(ps.Wall), Errors: ps.Errors,
		},
		EarlyExits: r.EarlyExits,
		Notes:      Notes(r),
	}
}

func ratioJSON(r Ratio) jsonRatio {
	if math.IsInf(r.Value, 0) || math.IsNaN(r.Value) {
		return jsonRatio{Text: r.Text}
	}
	v := r.Value
	return jsonRatio{Value: &v, Text: r.Text}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteJSON writes one result as an indented JSON object.
func WriteJSON(w io.Writer, r Result) error { return writeJSON(w, toJSON(r)) }

// WriteComparisonJSON writes both results and the ratios as one JSON object.
func WriteComparisonJSON(w io.Writer, c Comparison) error {
	return writeJSON(w, jsonComparison{
		Routing: toJSON(c.Routing),
		Random:  toJSON(c.Random),
		Ratios: map[string]jsonRatio{
			"label_misses":     ratioJSON(c.Misses()),
			"avg_task_runtime": ratioJSON(c.Runtime()),
			"latency_p95":      ratioJSON(c.P95()),
			"throughput":       ratioJSON(c.Throughput()),
		},
	})
}
