// Package producer runs the seed's closed-loop producers against a dispatcher: each
// producer sends one task, waits for its outcome, records it, pauses, and sends the next.
package producer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// MinWait is the seed's floor on the pause between two requests of one producer,
// before the time scale is applied.
const MinWait = 100 * time.Millisecond

// DefaultParameters is the parameters_json the seed's producers send.
const DefaultParameters = `{"data": "sample"}`

// Config says what the producers send and how fast. The zero value of each optional
// field is documented on the field.
type Config struct {
	// BaseURL is the dispatcher's HTTP address, such as "http://127.0.0.1:8080". Required.
	BaseURL string
	// RunID goes into every task id, "bench-<RunID>-<n>". Zero means "run".
	RunID string
	// Requests is the total number of requests, split across the producers. At least 1.
	Requests int
	// Producers is the number of concurrent closed-loop producers. At least 1.
	Producers int
	// WaitAvg and WaitStddev shape the pause after each request: the pause is
	// max(MinWait, normal(WaitAvg, WaitStddev)) * TimeScale. Zero WaitAvg means the
	// pause is MinWait (scaled); zero WaitStddev means no spread.
	WaitAvg, WaitStddev time.Duration
	// Labels are chosen uniformly for each request. Required.
	Labels []string
	// TaskTypes are chosen uniformly for each request. Zero means ["sample_task"].
	TaskTypes []string
	// SyncShare is the share of synchronous requests in [0, 1]; the rest are sent with
	// "return_result": false and polled until they end. Zero means all asynchronous.
	SyncShare float64
	// Seed makes the labels, task types, sync choices and pauses reproducible: the same
	// seed sends the same sequence whatever the dispatcher does.
	Seed uint64
	// TimeScale multiplies every pause. Zero means 1.
	TimeScale float64
	// Parameters is the parameters_json of every task. Zero means DefaultParameters.
	Parameters string
	// RequestTimeout bounds one request, polling included. Zero means no bound
	// beyond the context.
	RequestTimeout time.Duration
	// PollInterval is how often an asynchronous task's state is fetched. Zero means 20 ms.
	PollInterval time.Duration
	// Client sends the requests. Zero means a client that keeps one connection per
	// producer alive and uses no proxy.
	Client *http.Client
	// Sleep pauses between requests; it returns early with the context's error. Zero
	// means a timer. Tests inject one that records the pause and returns at once.
	Sleep func(ctx context.Context, d time.Duration) error
	// OnResult is called from the producer goroutines after every request; it must be
	// safe for concurrent use. Zero means nothing is called.
	OnResult func(Record)
}

// Record is what one producer saw of one request.
type Record struct {
	// N numbers the request from 1 to Config.Requests across all producers.
	N        int    `json:"n"`
	Producer int    `json:"producer"`
	TaskID   string `json:"task_id"`
	TaskType string `json:"task_type"`
	Label    string `json:"label"`
	Sync     bool   `json:"sync"`
	// Start is when the POST was sent; Latency runs from there to the final outcome
	// (for an asynchronous request: the poll that saw it end).
	Start   time.Time     `json:"start"`
	Latency time.Duration `json:"latency_ns"`
	// HTTPStatus is the status of the POST, zero when it got no answer.
	HTTPStatus int `json:"http_status"`
	// Dispatched is true when the dispatcher took the task in: 200 or 202, or an
	// answer that says the task failed after it was taken in (see dispatched), so
	// that a synchronous request counts as an asynchronous one does.
	Dispatched bool `json:"dispatched"`
	// OK is true when the task completed with a result.
	OK bool `json:"ok"`
	// Status is the last task status the dispatcher reported, if any.
	Status string `json:"status,omitempty"`
	// Error says why the request failed; empty when OK.
	Error     string  `json:"error,omitempty"`
	WorkerID  string  `json:"worker_id,omitempty"`
	LabelMiss bool    `json:"label_miss"`
	Attempts  int     `json:"attempts,omitempty"`
	QueueMS   float64 `json:"queue_ms"`
	LoadMS    float64 `json:"load_ms"`
	RunMS     float64 `json:"run_ms"`
}

func (c Config) withDefaults() Config {
	if c.RunID == "" {
		c.RunID = "run"
	}
	if len(c.TaskTypes) == 0 {
		c.TaskTypes = []string{"sample_task"}
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.Parameters == "" {
		c.Parameters = DefaultParameters
	}
	if c.PollInterval == 0 {
		c.PollInterval = 20 * time.Millisecond
	}
	if c.Client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Proxy = nil
		t.MaxIdleConnsPerHost = c.Producers + 1
		c.Client = &http.Client{Transport: t}
	}
	if c.Sleep == nil {
		c.Sleep = sleep
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.BaseURL == "":
		return errors.New("producer: BaseURL is required")
	case c.Requests < 1:
		return fmt.Errorf("producer: Requests is %d, must be at least 1", c.Requests)
	case c.Producers < 1:
		return fmt.Errorf("producer: Producers is %d, must be at least 1", c.Producers)
	case len(c.Labels) == 0:
		return errors.New("producer: Labels must not be empty")
	case c.WaitAvg < 0 || c.WaitStddev < 0:
		return errors.New("producer: WaitAvg and WaitStddev must not be negative")
	case !(c.SyncShare >= 0 && c.SyncShare <= 1):
		return fmt.Errorf("producer: SyncShare is %v, must be within [0, 1]", c.SyncShare)
	case !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0):
		return fmt.Errorf("producer: TimeScale is %v, must be positive", c.TimeScale)
	case c.PollInterval < 0 || c.RequestTimeout < 0:
		return errors.New("producer: PollInterval and RequestTimeout must not be negative")
	}
	return nil
}

// Run starts cfg.Producers producers and returns when all have sent their share of
// the requests, ordered by N. When ctx ends first, Run returns the records so far
// (the interrupted requests among them, failed) and ctx's error.
func Run(ctx context.Context, cfg Config) ([]Record, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	base, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("producer: BaseURL: %w", err)
	}

	// Each producer owns records[first : first+count] and writes nothing else.
	records := make([]Record, cfg.Requests)
	sent := make([]int, cfg.Producers)
	var wg sync.WaitGroup
	first := 0
	for i := range cfg.Producers {
		count := Share(cfg.Requests, cfg.Producers, i)
		p := &producer{cfg: cfg, base: base, index: i, rng: NewRand(cfg.Seed, i)}
		own, start := records[first:first+count], first
		wg.Go(func() { sent[i] = p.run(ctx, own, start) })
		first += count
	}
	wg.Wait()

	// Keep only what was sent: a producer stopped by ctx leaves the tail of its share empty.
	out := records[:0]
	first = 0
	for i := range cfg.Producers {
		out = append(out, records[first:first+sent[i]]...)
		first += Share(cfg.Requests, cfg.Producers, i)
	}
	return out, ctx.Err()
}

// Share is how many of total requests producer i of n sends: an even split, the
// first total%n producers sending one more.
func Share(total, n, i int) int {
	s := total / n
	if i < total%n {
		s++
	}
	return s
}

// NewRand is the random source of producer i: a function of the seed and i only.
func NewRand(seed uint64, i int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, uint64(i)))
}

// Wait is the seed's pause rule: max(MinWait, normal(avg, stddev)) * scale.
func Wait(rng *rand.Rand, avg, stddev time.Duration, scale float64) time.Duration {
	w := float64(avg) + rng.NormFloat64()*float64(stddev)
	w = max(w, float64(MinWait))
	return time.Duration(w * scale)
}

type producer struct {
	cfg   Config
	base  *url.URL
	index int
	rng   *rand.Rand // owned by this producer's goroutine
}

// run sends len(own) requests numbered first+1.. and returns how many it sent.
func (p *producer) run(ctx context.Context, own []Record, first int) int {
	for k := range own {
		if ctx.Err() != nil {
			return k
		}
		// Draw everything for this request before sending, so the sequence depends
		// on the seed only.
		r := Record{
			N:        first + k + 1,
			Producer: p.index,
			Label:    p.cfg.Labels[p.rng.IntN(len(p.cfg.Labels))],
			TaskType: p.cfg.TaskTypes[p.rng.IntN(len(p.cfg.TaskTypes))],
			Sync:     p.rng.Float64() < p.cfg.SyncShare,
		}
		r.TaskID = fmt.Sprintf("bench-%s-%d", p.cfg.RunID, r.N)
		wait := Wait(p.rng, p.cfg.WaitAvg, p.cfg.WaitStddev, p.cfg.TimeScale)

		p.send(ctx, &r)
		own[k] = r
		if p.cfg.OnResult != nil {
			p.cfg.OnResult(r)
		}
		if k == len(own)-1 {
			return len(own)
		}
		if err := p.cfg.Sleep(ctx, wait); err != nil {
			return k + 1
		}
	}
	return len(own)
}

type runTaskRequest struct {
	TaskID         string `json:"task_id"`
	TaskType       string `json:"task_type"`
	Label          string `json:"label"`
	ParametersJSON string `json:"parameters_json"`
	ReturnResult   *bool  `json:"return_result,omitempty"`
}

// taskResponse is the dispatcher's answer to POST /run-task and GET /tasks/{id};
// errors carry only Error.
type taskResponse struct {
	TaskID    string  `json:"task_id"`
	Status    string  `json:"status"`
	WorkerID  string  `json:"worker_id"`
	LabelMiss bool    `json:"label_miss"`
	Attempts  int     `json:"attempts"`
	QueueMS   float64 `json:"queue_ms"`
	LoadMS    float64 `json:"load_ms"`
	RunMS     float64 `json:"run_ms"`
	Error     string  `json:"error"`
}

// Task states the dispatcher reports.
const (
	statusCompleted = "completed"
	statusFailed    = "failed"
)

func (p *producer) send(ctx context.Context, r *Record) {
	if p.cfg.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.RequestTimeout)
		defer cancel()
	}
	body := runTaskRequest{
		TaskID:         r.TaskID,
		TaskType:       r.TaskType,
		Label:          r.Label,
		ParametersJSON: p.cfg.Parameters,
	}
	if !r.Sync {
		f := false
		body.ReturnResult = &f
	}
	r.Start = time.Now()
	defer func() { r.Latency = time.Since(r.Start) }()

	status, resp, err := p.do(ctx, http.MethodPost, p.base.JoinPath("run-task").String(), body)
	r.HTTPStatus = status
	if err != nil {
		r.Error = err.Error()
		return
	}
	r.Dispatched = dispatched(status, resp)
	if !r.Dispatched || !isView(resp) {
		r.Status = resp.Status
		r.Error = httpError(status, resp)
		return
	}
	r.TaskID = resp.TaskID
	if status == http.StatusAccepted || (!r.Sync && !ended(resp.Status)) {
		resp, err = p.poll(ctx, r.TaskID)
		if err != nil {
			r.Status = resp.Status
			r.Error = err.Error()
			return
		}
	}
	r.fill(resp)
}

// isView says whether an answer carries the task's state (the dispatcher's task view,
// or its 202), rather than only {"error": ...}.
func isView(resp taskResponse) bool { return resp.TaskID != "" && resp.Status != "" }

// dispatched says whether the answer to POST /run-task shows that the dispatcher took
// the task in. A synchronous task that ran and failed is answered with the task's
// view and the status of the failure (502, 503, 504: its deadline passed queued or
// running, or its worker overran it); an asynchronous one got 202 and learns of the
// failure from GET /tasks/{id}: both were dispatched. A refusal at admission was
// not, whether it carries only an error or the task's view.
func dispatched(status int, resp taskResponse) bool {
	switch {
	case status == http.StatusOK || status == http.StatusAccepted:
		return true
	case !isView(resp):
		// Refused at admission: a bad body (400, 413), auth (401, 403), full queues
		// (429), shutting down or the journal failing (503); or not the dispatcher's
		// answer (a proxy's 502 or 504). Every 504 of the dispatcher carries the view.
		return false
	case status == http.StatusServiceUnavailable && resp.Attempts == 0:
		// Failed as it was routed, before any worker had it: no connected worker can
		// load its label, or the label is failing. An asynchronous request gets the same
		// answer instead of a 202. (A task that waited in the queue and failed so later
		// reads the same; an asynchronous one would count: rare, and not told apart.)
		return false
	}
	// A worker had it: it failed there or failed to load the label (502), or every
	// worker it was given to was lost (503).
	return true
}

// poll fetches the task's state until it ends or ctx does.
func (p *producer) poll(ctx context.Context, taskID string) (taskResponse, error) {
	u := p.base.JoinPath("tasks", taskID).String()
	t := time.NewTicker(p.cfg.PollInterval)
	defer t.Stop()
	var last taskResponse
	for {
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("waiting for task %s (last status %q): %w", taskID, last.Status, ctx.Err())
		case <-t.C:
		}
		status, resp, err := p.do(ctx, http.MethodGet, u, nil)
		if err != nil {
			return last, err
		}
		if status != http.StatusOK {
			return last, errors.New(httpError(status, resp))
		}
		last = resp
		if ended(resp.Status) {
			return resp, nil
		}
	}
}

func ended(status string) bool { return status == statusCompleted || status == statusFailed }

func (r *Record) fill(resp taskResponse) {
	r.Status = resp.Status
	r.WorkerID = resp.WorkerID
	r.LabelMiss = resp.LabelMiss
	r.Attempts = resp.Attempts
	r.QueueMS, r.LoadMS, r.RunMS = resp.QueueMS, resp.LoadMS, resp.RunMS
	r.OK = resp.Status == statusCompleted
	if !r.OK {
		r.Error = fmt.Sprintf("task ended %q", resp.Status)
		if resp.Error != "" {
			r.Error += ": " + resp.Error
		}
	}
}

// maxBody bounds how much of a response is read.
const maxBody = 8 << 20

// do sends one request and decodes a JSON answer. A non-JSON answer is not an error:
// its start lands in taskResponse.Error so the caller can report it.
func (p *producer) do(ctx context.Context, method, u string, body any) (int, taskResponse, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, taskResponse{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, taskResponse{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return 0, taskResponse{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return resp.StatusCode, taskResponse{}, fmt.Errorf("reading %s %s answer: %w", method, req.URL.Path, err)
	}
	var tr taskResponse
	if err := json.Unmarshal(b, &tr); err != nil {
		tr = taskResponse{Error: strings.TrimSpace(string(b[:min(len(b), 200)]))}
	}
	return resp.StatusCode, tr, nil
}

func httpError(status int, resp taskResponse) string {
	if resp.Error == "" {
		return fmt.Sprintf("HTTP %d", status)
	}
	return fmt.Sprintf("HTTP %d: %s", status, resp.Error)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
