// Package workerlog reads the worker agents' JSON log lines and sums up what the
// workers did: the seed's "Worker Log Summary".
//
// The records it reads (other lines, JSON or not, are skipped):
//
//	{"event":"label_miss","worker_id","task_id","label","load_ms"}
//	{"event":"task_completed","worker_id","task_id","attempt","label","label_miss","load_ms","run_ms","total_ms","ok"}
//
// and the notes the log collector adds to a worker's file when records are lost:
//
//	{"event":"log_records_dropped","worker_id","dropped","dropped_total"}
//	{"event":"log_batches_missing","worker_id","missing_from","missing_to"}
//
// Times are milliseconds as floats.
package workerlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"time"
)

// Event names of the records Summarize reads.
const (
	EventLabelMiss     = "label_miss"
	EventTaskCompleted = "task_completed"
	// The log collector's notes (log-collector/ingest.go): "dropped" records the agent
	// dropped since the last note (its buffer was full), and the batches whose
	// sequence numbers, missing_from to missing_to, never reached the files.
	EventLogRecordsDropped = "log_records_dropped"
	EventLogBatchesMissing = "log_batches_missing"
)

// Summary is what the workers' logs say about a run.
type Summary struct {
	// LabelMisses is how many times a worker had to load a label for a task. A miss
	// logged both as a label_miss record and on its task_completed record counts once.
	LabelMisses int
	// TasksCompleted is how many tasks (task ids) completed: those whose last run's
	// task_completed record says ok. A task runs more than once when the result of a
	// run is lost with its connection (the agent had queued it, and logged the task as
	// done; the dispatcher ran it again): the producer got one result, so the task
	// counts once, by its run of the highest attempt (on a tie, an ok one, then the
	// first read), which is the result the dispatcher answered with.
	TasksCompleted int
	// TasksFailed is how many tasks' last run says not ok.
	TasksFailed int
	// TasksRerun is how many task_completed records repeat a task id already read:
	// the runs beyond each task's last (see TasksCompleted). Their loads count in
	// LabelMisses; nothing else of them counts.
	TasksRerun int
	// AvgTaskRuntime is the mean total_ms (load + run on the worker) of the completed
	// tasks' last runs: the seed's "Average Task Runtime".
	AvgTaskRuntime time.Duration
	// AvgLoadTime is the mean load_ms of the completed tasks whose last run missed;
	// AvgRunTime the mean run_ms of all completed tasks' last runs.
	AvgLoadTime, AvgRunTime time.Duration
	// LogRecordsDropped and LogBatchesMissing sum the log collector's notes: records
	// the agents dropped, and batches of records missing from the files. The counts
	// above are short by an unknown share of them (a batch holds many records).
	LogRecordsDropped, LogBatchesMissing int
	// Workers holds the same counts per worker id.
	Workers map[string]WorkerStats
	// Records is how many records of the kinds above were read; Skipped how many
	// lines were not JSON objects or did not decode.
	Records, Skipped int
}

// WorkerStats is one worker's share of a Summary: a task counts for the worker of its
// last run, a rerun for the worker of the run that was not the last.
type WorkerStats struct {
	LabelMisses    int
	TasksCompleted int
	TasksFailed    int
	TasksRerun     int

	LogRecordsDropped, LogBatchesMissing int
}

// record is the union of the fields of the records Summarize reads.
type record struct {
	Event     string   `json:"event"`
	WorkerID  string   `json:"worker_id"`
	TaskID    string   `json:"task_id"`
	Attempt   int      `json:"attempt"`
	Label     string   `json:"label"`
	LabelMiss bool     `json:"label_miss"`
	LoadMS    float64  `json:"load_ms"`
	RunMS     float64  `json:"run_ms"`
	TotalMS   *float64 `json:"total_ms"`
	OK        *bool    `json:"ok"`
	// The collector's notes. Floats: any JSON number decodes, so an odd value in a
	// note cannot make a line of another kind undecodable.
	Dropped     float64 `json:"dropped"`
	MissingFrom float64 `json:"missing_from"`
	MissingTo   float64 `json:"missing_to"`
}

// maxLine bounds one log line; longer lines are an error rather than a silent cut.
const maxLine = 16 << 20

// Summarize reads the logs of one run, one reader per worker or all in one, and sums
// them up. It fails only when a reader does.
func Summarize(logs ...io.Reader) (Summary, error) {
	var a accumulator
	for i, rd := range logs {
		sc := bufio.NewScanner(rd)
		sc.Buffer(make([]byte, 0, 64<<10), maxLine)
		for sc.Scan() {
			a.line(sc.Bytes())
		}
		if err := sc.Err(); err != nil {
			return Summary{}, fmt.Errorf("workerlog: reading log %d: %w", i+1, err)
		}
	}
	return a.summary(), nil
}

type accumulator struct {
	s      Summary
	misses map[string]int // "worker_id\x00task_id" of the misses counted: the attempt (0: unknown)
	// runs are the task_completed records by task, in the order the tasks were first
	// read (so that the sums, and the summary, do not depend on map order); byID finds
	// a task's entry. A record without a task id is a task of its own.
	runs []*taskRuns
	byID map[string]*taskRuns
}

// taskRuns are the task_completed records of one task.
type taskRuns struct {
	last   record   // the run the task counts by
	others []string // the workers of its other runs
}

// later reports whether r replaces cur as the task's last run: a higher attempt, or
// on the same attempt an ok run over a failed one.
func later(r, cur record) bool {
	if r.Attempt != cur.Attempt {
		return r.Attempt > cur.Attempt
	}
	return ok(r) && !ok(cur)
}

// ok says a task_completed record says ok; a record without "ok" does.
func ok(r record) bool { return r.OK == nil || *r.OK }

func (a *accumulator) line(b []byte) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return
	}
	if b[0] != '{' {
		a.s.Skipped++
		return
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		a.s.Skipped++
		return
	}
	switch r.Event {
	case EventLabelMiss:
		a.s.Records++
		a.miss(r)
	case EventTaskCompleted:
		a.s.Records++
		a.completed(r)
	case EventLogRecordsDropped:
		a.s.Records++
		n := count(r.Dropped)
		a.s.LogRecordsDropped = addSat(a.s.LogRecordsDropped, n)
		a.worker(r.WorkerID, func(w *WorkerStats) { w.LogRecordsDropped = addSat(w.LogRecordsDropped, n) })
	case EventLogBatchesMissing:
		a.s.Records++
		n := count(r.MissingTo - r.MissingFrom + 1)
		a.s.LogBatchesMissing = addSat(a.s.LogBatchesMissing, n)
		a.worker(r.WorkerID, func(w *WorkerStats) { w.LogBatchesMissing = addSat(w.LogBatchesMissing, n) })
	}
}

// count is a note's count as an int: none when not positive, at most math.MaxInt.
func count(v float64) int {
	switch {
	case !(v > 0):
		return 0
	case v >= math.MaxInt:
		return math.MaxInt
	}
	return int(v)
}

// addSat adds two counts that are not negative, stopping at math.MaxInt: the numbers
// come from files, and must not wrap into nonsense.
func addSat(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

func (a *accumulator) miss(r record) {
	if r.TaskID != "" {
		// A task's label_miss and its task_completed both report one load. A second
		// attempt of the task on the same worker (it reconnected and got the task back)
		// is a second load; a record without an attempt (older agents' label_miss)
		// matches any.
		key := r.WorkerID + "\x00" + r.TaskID
		if prev, seen := a.misses[key]; seen && (prev == 0 || r.Attempt == 0 || prev == r.Attempt) {
			return
		}
		if a.misses == nil {
			a.misses = map[string]int{}
		}
		a.misses[key] = r.Attempt
	}
	a.s.LabelMisses++
	a.worker(r.WorkerID, func(w *WorkerStats) { w.LabelMisses++ })
}

func (a *accumulator) completed(r record) {
	// Every run's load was a real one: misses count per run, reruns included.
	if r.LabelMiss {
		a.miss(r)
	}
	t := a.byID[r.TaskID]
	if t == nil || r.TaskID == "" {
		t = &taskRuns{last: r}
		a.runs = append(a.runs, t)
		if r.TaskID != "" {
			if a.byID == nil {
				a.byID = map[string]*taskRuns{}
			}
			a.byID[r.TaskID] = t
		}
		return
	}
	if later(r, t.last) {
		t.others = append(t.others, t.last.WorkerID)
		t.last = r
	} else {
		t.others = append(t.others, r.WorkerID)
	}
}

func (a *accumulator) worker(id string, f func(*WorkerStats)) {
	if a.s.Workers == nil {
		a.s.Workers = map[string]WorkerStats{}
	}
	w := a.s.Workers[id]
	f(&w)
	a.s.Workers[id] = w
}

// summary counts the tasks by their last runs. It leaves the accumulator as it was.
func (a *accumulator) summary() Summary {
	s := a.s
	s.Workers = maps.Clone(a.s.Workers)
	var runtimeMS, loadMS, runMS float64
	loads := 0
	worker := func(id string, f func(*WorkerStats)) {
		if s.Workers == nil {
			s.Workers = map[string]WorkerStats{}
		}
		w := s.Workers[id]
		f(&w)
		s.Workers[id] = w
	}
	for _, t := range a.runs {
		for _, id := range t.others {
			s.TasksRerun++
			worker(id, func(w *WorkerStats) { w.TasksRerun++ })
		}
		r := t.last
		if !ok(r) {
			s.TasksFailed++
			worker(r.WorkerID, func(w *WorkerStats) { w.TasksFailed++ })
			continue
		}
		s.TasksCompleted++
		worker(r.WorkerID, func(w *WorkerStats) { w.TasksCompleted++ })
		total := r.LoadMS + r.RunMS
		if r.TotalMS != nil {
			total = *r.TotalMS
		}
		runtimeMS += total
		runMS += r.RunMS
		if r.LabelMiss {
			loadMS += r.LoadMS
			loads++
		}
	}
	if n := s.TasksCompleted; n > 0 {
		s.AvgTaskRuntime = ms(runtimeMS / float64(n))
		s.AvgRunTime = ms(runMS / float64(n))
	}
	if loads > 0 {
		s.AvgLoadTime = ms(loadMS / float64(loads))
	}
	return s
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
