// Package batch runs a JSON-lines file of tasks through the dispatcher and writes a
// JSON-lines file of results, line n for input line n, each exactly once, resumable
// from a checkpoint after any stop (see README "Batch jobs").
package batch

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"
)

// Order is how items are submitted.
type Order string

const (
	// OrderLabel groups submissions by label within the look-ahead window, so the fleet
	// loads each label as few times as possible.
	OrderLabel Order = "label"
	// OrderFile submits in file order (the comparison baseline).
	OrderFile Order = "file"
)

// Config of a batch job. Zero values take the documented defaults (WithDefaults).
type Config struct {
	// DispatcherURL is the dispatcher's base URL. Default http://127.0.0.1:8080.
	DispatcherURL string
	// APIKey, when set, is sent as "Authorization: Bearer KEY".
	APIKey string
	// Input is the JSON-lines file of tasks. Required.
	Input string
	// Output is the JSON-lines file of results. Required.
	Output string
	// Rejected receives the lines that could not be run, with the reason. Default
	// <Output>.rejected.jsonl.
	Rejected string
	// Checkpoint records progress. Default <Output>.checkpoint.
	Checkpoint string
	// Concurrency is how many tasks are in flight at once. Default 64.
	Concurrency int
	// WorkTimeout is how long an issued item may go unanswered (a proxy's bare 502s are
	// no answer) before it is issued again, an attempt counted; it can be changed while
	// the job runs (control server). Default DefaultWorkTimeout.
	WorkTimeout time.Duration
	// MaxAttempts is how many times an item is issued (timeouts and failed answers)
	// before it goes to the rejected file. Default 3.
	MaxAttempts int
	// RetryDelay is how long an item waits after a failed answer before it is issued
	// again. It doubles with each failed answer of the item, and is at least the
	// answer's Retry-After (the rest of a failing label's cool-down). Default 1s.
	RetryDelay time.Duration
	// Lookahead is how many read but not yet issued lines the label-aware order chooses
	// from. Default half of MaxOutOfOrder (5000).
	Lookahead int
	// LabelsAtOnce is how many label passes the label order issues in turn. Keep it
	// well under the labels the fleet holds at once: on 8 agents holding 2 labels each,
	// 3 kept loads flat where 8 let them creep back to file order's. Default 3.
	LabelsAtOnce int
	// MaxOutOfOrder bounds the lines held between the oldest unwritten line and the
	// newest read one (results waiting for an earlier line, and lines in flight or not
	// issued yet). Reading stops when it is full. Default 10000.
	MaxOutOfOrder int
	// MaxWindowBytes bounds the memory those lines hold, which MaxOutOfOrder, counting
	// lines, does not: input lines not yet answered (the line and its parameters) and
	// answers waiting for an earlier line. When it is reached, reading stops and only
	// the oldest unwritten line is issued, whose answer lets the window drain; the
	// answers in flight (Concurrency) come on top. Default 256 MiB.
	MaxWindowBytes int64
	// MaxLineBytes is the longest input line; longer ones are rejected. Default 1 MiB,
	// the dispatcher's body limit.
	MaxLineBytes int
	// Fields are the input's field names (defaults label, task_type, parameters, id).
	Fields Fields
	// DefaultTaskType is used for lines without a task type. Empty: the field is required.
	DefaultTaskType string
	// Order is OrderLabel (default) or OrderFile.
	Order Order
	// CheckpointInterval is how often written results are made durable and the
	// checkpoint advanced. Default 1s.
	CheckpointInterval time.Duration
	// ControlAddr, when set, serves POST /work-timeout and GET /status. Off by default.
	ControlAddr string
	// ControlListener, when set, is used for the control server instead of ControlAddr
	// (tests, embedding).
	ControlListener net.Listener
	// Progress, when set, gets a progress bar (a terminal). Nil: none.
	Progress io.Writer
	// Logger is the job's logger. Zero value: a disabled logger.
	Logger zerolog.Logger
	// HTTPClient calls the dispatcher. Nil: a client without proxy or overall timeout
	// (the work timeout bounds each call).
	HTTPClient *http.Client

	// syncDir fsyncs a directory (tests record the calls; a power cut cannot be
	// simulated). Nil: the real one.
	syncDir func(dir string) error
	// syncFile fsyncs the output or rejected file (tests fail it). Nil: f.Sync.
	syncFile func(f *os.File) error
	// opened, when set, is called between opening the output or rejected file and
	// locking it (tests interleave runs there).
	opened func(path string)
	// maxAnswerBytes bounds the dispatcher's answer read for one line; a larger one
	// rejects the line. Zero: 64 MiB (tests lower it).
	maxAnswerBytes int64
}

// DefaultWorkTimeout outlasts the dispatcher's own answer: it answers every task by its
// deadline (--task-timeout, 5m by default) plus 5 s, 504 when it is past. A work timeout
// equal to the deadline expired first, counted an attempt, and the reissue attached to
// the run and got its 504: one deadline cost two attempts. The work timeout is the
// backstop for an answer that never comes, so it must come after the dispatcher's.
const DefaultWorkTimeout = 6 * time.Minute

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	def(&c.DispatcherURL, "http://127.0.0.1:8080")
	if c.Output != "" {
		def(&c.Rejected, c.Output+".rejected.jsonl")
		def(&c.Checkpoint, c.Output+".checkpoint")
	}
	defInt(&c.Concurrency, 64)
	if c.WorkTimeout == 0 {
		c.WorkTimeout = DefaultWorkTimeout
	}
	defInt(&c.MaxAttempts, 3)
	if c.RetryDelay == 0 {
		c.RetryDelay = time.Second
	}
	defInt(&c.LabelsAtOnce, 3)
	defInt(&c.MaxOutOfOrder, 10000)
	defInt(&c.Lookahead, max(1, c.MaxOutOfOrder/2))
	defInt(&c.MaxLineBytes, 1<<20)
	if c.MaxWindowBytes == 0 {
		c.MaxWindowBytes = 256 << 20
	}
	def(&c.Fields.Label, "label")
	def(&c.Fields.TaskType, "task_type")
	def(&c.Fields.Parameters, "parameters")
	def(&c.Fields.ID, "id")
	if c.Order == "" {
		c.Order = OrderLabel
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = time.Second
	}
	if c.maxAnswerBytes == 0 {
		c.maxAnswerBytes = 64 << 20
	}
	if c.syncFile == nil {
		c.syncFile = (*os.File).Sync
	}
	if c.syncDir == nil {
		c.syncDir = syncDir
	}
	if c.HTTPClient == nil {
		// IdleConnTimeout below the dispatcher's --idle-timeout (2m): the client closes
		// an idle connection first, rather than send a task on one the dispatcher is
		// closing (a POST is not retried).
		c.HTTPClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: c.Concurrency,
			IdleConnTimeout: 90 * time.Second}}
	}
	return c
}

// Validate reports every problem of a config that went through WithDefaults, each
// naming its field. Run calls it; callers may call it to refuse a job before starting
// anything it needs.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if u, err := url.Parse(c.DispatcherURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("DispatcherURL must be an http(s) URL, got %q", c.DispatcherURL)
	}
	if c.Input == "" {
		bad("Input is required")
	}
	if c.Output == "" {
		bad("Output is required")
	}
	if c.Output != "" && (sameFile(c.Output, c.Input) || sameFile(c.Rejected, c.Input) || sameFile(c.Checkpoint, c.Input) ||
		sameFile(c.Rejected, c.Output) || sameFile(c.Checkpoint, c.Output) || sameFile(c.Checkpoint, c.Rejected)) {
		bad("Input, Output, Rejected and Checkpoint must be four different files")
	}
	positive := func(name string, v int64) {
		if v <= 0 {
			bad("%s must be positive, got %d", name, v)
		}
	}
	positive("Concurrency", int64(c.Concurrency))
	positive("WorkTimeout", int64(c.WorkTimeout))
	positive("MaxAttempts", int64(c.MaxAttempts))
	positive("RetryDelay", int64(c.RetryDelay))
	positive("Lookahead", int64(c.Lookahead))
	positive("MaxOutOfOrder", int64(c.MaxOutOfOrder))
	positive("LabelsAtOnce", int64(c.LabelsAtOnce))
	positive("MaxLineBytes", int64(c.MaxLineBytes))
	positive("MaxWindowBytes", c.MaxWindowBytes)
	if c.MaxWindowBytes < int64(c.MaxLineBytes) {
		bad("MaxWindowBytes (%d) must be at least MaxLineBytes (%d): the window must hold a line", c.MaxWindowBytes, c.MaxLineBytes)
	}
	positive("CheckpointInterval", int64(c.CheckpointInterval))
	if c.Lookahead > c.MaxOutOfOrder {
		bad("Lookahead (%d) must not exceed MaxOutOfOrder (%d): look-ahead lines are held in the same window", c.Lookahead, c.MaxOutOfOrder)
	}
	if c.ControlAddr != "" {
		host, _, err := net.SplitHostPort(c.ControlAddr)
		if ip := net.ParseIP(host); err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
			bad("ControlAddr must be a loopback host:port (the control API has no authentication), got %q", c.ControlAddr)
		}
	}
	if c.Order != OrderLabel && c.Order != OrderFile {
		bad("Order must be %q or %q, got %q", OrderLabel, OrderFile, c.Order)
	}
	for name, v := range map[string]string{"Fields.Label": c.Fields.Label, "Fields.TaskType": c.Fields.TaskType, "Fields.Parameters": c.Fields.Parameters, "Fields.ID": c.Fields.ID} {
		if v == "" {
			bad("%s must not be empty", name)
		}
	}
	return errors.Join(errs...)
}

// sameFile says whether two paths name one file: spelled alike once cleaned and made
// absolute ("out.jsonl" and "./out.jsonl"), or, for files that exist, one file under
// two names (a link). Compared as text only, the checkpoint's rename could replace the
// output it was told apart from.
func sameFile(a, b string) bool {
	if a == "" || b == "" {
		return a == b
	}
	if absA, err := filepath.Abs(a); err == nil {
		if absB, err := filepath.Abs(b); err == nil && absA == absB {
			return true
		}
	}
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}
