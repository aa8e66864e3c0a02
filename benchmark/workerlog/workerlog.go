// Package workerlog reads the worker agents' JSON log lines and sums up what the
// workers did: the seed's "Worker Log Summary".
//
// The records it reads (other lines, JSON or not, are skipped):
//
//	{"event":"label_miss","worker_id","task_id","label","load_ms"}
//	{"event":"task_completed","worker_id","task_id","attempt","label","label_miss","load_ms","run_ms","total_ms","ok"}
//
// Times are milliseconds as floats.
package workerlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// Event names of the records Summarize reads.
const (
	EventLabelMiss     = "label_miss"
	EventTaskCompleted = "task_completed"
)

// Summary is what the workers' logs say about a run.
type Summary struct {
	// LabelMisses is how many times a worker had to load a label for a task. A miss
	// logged both as a label_miss record and on its task_completed record counts once.
	LabelMisses int
	// TasksCompleted is how many task_completed records say ok.
	TasksCompleted int
	// TasksFailed is how many task_completed records say not ok.
	TasksFailed int
	// AvgTaskRuntime is the mean total_ms (load + run on the worker) of the completed
	// tasks: the seed's "Average Task Runtime".
	AvgTaskRuntime time.Duration
	// AvgLoadTime is the mean load_ms of the completed tasks that missed; AvgRunTime
	// the mean run_ms of all completed tasks.
	AvgLoadTime, AvgRunTime time.Duration
	// Workers holds the same counts per worker id.
	Workers map[string]WorkerStats
	// Records is how many records of the two kinds above were read; Skipped how many
	// lines were not JSON objects or did not decode.
	Records, Skipped int
}

// WorkerStats is one worker's share of a Summary.
type WorkerStats struct {
	LabelMisses    int
	TasksCompleted int
	TasksFailed    int
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
	s                        Summary
	misses                   map[string]int // "worker_id\x00task_id" of the misses counted: the attempt (0: unknown)
	runtimeMS, loadMS, runMS float64
	loads                    int
}

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
	}
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
	if r.LabelMiss {
		a.miss(r)
	}
	if r.OK != nil && !*r.OK {
		a.s.TasksFailed++
		a.worker(r.WorkerID, func(w *WorkerStats) { w.TasksFailed++ })
		return
	}
	a.s.TasksCompleted++
	a.worker(r.WorkerID, func(w *WorkerStats) { w.TasksCompleted++ })
	total := r.LoadMS + r.RunMS
	if r.TotalMS != nil {
		total = *r.TotalMS
	}
	a.runtimeMS += total
	a.runMS += r.RunMS
	if r.LabelMiss {
		a.loadMS += r.LoadMS
		a.loads++
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

func (a *accumulator) summary() Summary {
	s := a.s
	if n := s.TasksCompleted; n > 0 {
		s.AvgTaskRuntime = ms(a.runtimeMS / float64(n))
		s.AvgRunTime = ms(a.runMS / float64(n))
	}
	if a.loads > 0 {
		s.AvgLoadTime = ms(a.loadMS / float64(a.loads))
	}
	return s
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
