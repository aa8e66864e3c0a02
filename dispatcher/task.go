package dispatcher

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
)

// Task states as GET /tasks/{id} reports them.
const (
	statusQueued    = "queued"
	statusRunning   = "running"
	statusCompleted = "completed"
	statusFailed    = "failed"
)

// taskRecord is the dispatcher's record of one task. Every field after the first
// block is guarded by hub.mu until done is closed; after that it never changes, so
// anyone who has received from done may read it without the lock.
type taskRecord struct {
	sched        scheduler.Task
	taskType     string
	params       []byte
	returnResult bool
	created      time.Time
	// fingerprint identifies what was asked (taskFingerprint): a resubmission of the
	// id with other content is refused rather than handed this task's answer. Zero
	// for a task journaled by a build that did not keep it: any content matches.
	fingerprint uint64
	// admitting: a producer's submission being routed under admitLocked, so that a
	// refusal there (finish) is answered but not kept as the id's answer.
	admitting bool
	// refusedAtAdmit: the task failed as it was routed, under the lock of its admission
	// (no worker can load its label, the label is failing). Written by admitLocked, read
	// by the submitting goroutine: an asynchronous producer gets such a refusal instead
	// of a 202, and a 202 for a task that ran and failed since.
	refusedAtAdmit bool

	status     string // empty until finished: live state comes from sched
	workerID   string
	labelMiss  bool
	queueTime  time.Duration
	loadTime   time.Duration
	runTime    time.Duration
	result     json.RawMessage
	errMsg     string
	httpStatus int
	finishedAt time.Time
	// retryAt, for a failed answer, is when the task might work if submitted again
	// (a failing label's cool-down ends): /run-task says so in Retry-After.
	retryAt time.Time
	// journaled: the journal holds this task and must learn its answer. journalRun is
	// the Created (unix ns) of the record it answers when another submission of the id
	// wrote it (adoptLocked); zero: its own, created. The journal writes an answer only
	// over its own run's record.
	journaled  bool
	journalRun int64
	done       chan struct{}
	metrics    *labelMetrics // the label's counters, resolved once (metrics.of)
}

// taskFingerprint is a stable 64-bit hash of a task's label, type and parameters,
// the same across restarts (the journal keeps it). Label and type are printable
// ASCII, so a NUL between the fields keeps them apart. Never zero: zero means "not
// known".
func taskFingerprint(label, taskType string, params []byte) uint64 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(label)
	_, _ = d.Write(fieldSeparator)
	_, _ = d.WriteString(taskType)
	_, _ = d.Write(fieldSeparator)
	_, _ = d.Write(params)
	if fp := d.Sum64(); fp != 0 {
		return fp
	}
	return 1
}

var fieldSeparator = []byte{0}

// sameTask reports whether a task known under an id and one submitted under it ask
// for the same thing; a record without a fingerprint matches anything.
func sameTask(known, submitted uint64) bool {
	return known == 0 || submitted == 0 || known == submitted
}

// finished reports whether the task has its final answer. Caller holds hub.mu or has
// received from done.
func (r *taskRecord) finished() bool { return r.status == statusCompleted || r.status == statusFailed }

// taskView is the JSON shape of a task in /run-task answers and GET /tasks/{id}.
type taskView struct {
	TaskID    string          `json:"task_id"`
	Status    string          `json:"status"`
	Label     string          `json:"label"`
	TaskType  string          `json:"task_type"`
	WorkerID  string          `json:"worker_id,omitempty"`
	LabelMiss bool            `json:"label_miss"`
	Attempts  int             `json:"attempts"`
	QueueMS   float64         `json:"queue_ms"`
	LoadMS    float64         `json:"load_ms"`
	RunMS     float64         `json:"run_ms"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     string          `json:"error,omitempty"`
}

// view snapshots the record. Caller holds hub.mu or has received from done.
func (r *taskRecord) view() taskView {
	status, workerID := r.status, r.workerID
	if !r.finished() {
		// Unfinished tasks take their state from the scheduler, so a task requeued
		// after its worker was lost reads as queued, not running on the lost worker.
		status, workerID = statusQueued, ""
		if r.sched.Running() {
			status, workerID = statusRunning, r.sched.WorkerID()
		}
	}
	return taskView{
		TaskID:    r.sched.ID,
		Status:    status,
		Label:     r.sched.Label,
		TaskType:  r.taskType,
		WorkerID:  workerID,
		LabelMiss: r.labelMiss,
		Attempts:  r.sched.Attempt,
		QueueMS:   ms(r.queueTime),
		LoadMS:    ms(r.loadTime),
		RunMS:     ms(r.runTime),
		Result:    r.result,
		Error:     r.errMsg,
	}
}

// answerStatus is the HTTP status of a finished task's answer.
func (r *taskRecord) answerStatus() int {
	if r.httpStatus != 0 {
		return r.httpStatus
	}
	return http.StatusOK
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// resultJSON makes a worker's result embeddable: JSON as is, anything else as a string.
// It returns a copy: the reader decodes every frame into the same buffers.
func resultJSON(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	if validJSON(b) {
		return bytes.Clone(b)
	}
	s, _ := json.Marshal(string(b))
	return s
}

// run is the Created of the journal record the task answers. Caller holds hub.mu, or
// has received from done.
func (r *taskRecord) run() int64 {
	if r.journalRun != 0 {
		return r.journalRun
	}
	return r.created.UnixNano()
}

// entry is the record as the journal stores it. Caller holds hub.mu, or has received
// from done, or is the record's only holder.
func (r *taskRecord) entry() *journalEntry {
	e := &journalEntry{ID: r.sched.ID, Label: r.sched.Label, TaskType: r.taskType, Params: r.params,
		Created: r.run(), Deadline: r.sched.Deadline.UnixNano(), Fingerprint: r.fingerprint}
	if r.finished() {
		e.Finished = r.finishedAt.UnixNano()
		e.Status, e.HTTPStatus, e.Error, e.Result = r.status, r.httpStatus, r.errMsg, r.result
		e.WorkerID, e.Attempts, e.LabelMiss = r.workerID, r.sched.Attempt, r.labelMiss
		e.QueueNS, e.LoadNS, e.RunNS = int64(r.queueTime), int64(r.loadTime), int64(r.runTime)
	}
	return e
}

// recordFromEntry rebuilds an answered task from the journal.
func recordFromEntry(e journalEntry) *taskRecord {
	r := &taskRecord{taskType: e.TaskType, fingerprint: e.Fingerprint, created: time.Unix(0, e.Created), status: e.Status,
		workerID: e.WorkerID, labelMiss: e.LabelMiss, queueTime: time.Duration(e.QueueNS),
		loadTime: time.Duration(e.LoadNS), runTime: time.Duration(e.RunNS), result: e.Result, errMsg: e.Error,
		httpStatus: e.HTTPStatus, finishedAt: time.Unix(0, e.Finished), done: make(chan struct{})}
	r.sched = scheduler.Task{ID: e.ID, Label: e.Label, Deadline: time.Unix(0, e.Deadline), Attempt: e.Attempts, Ref: r}
	close(r.done)
	return r
}
