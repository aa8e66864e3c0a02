package dispatcher

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/dispatcher/scheduler"
	"github.com/smartroute/smartroute/proto/frame"
)

// Config configures a Dispatcher. The zero value of each field means its default.
type Config struct {
	// Addr is the listen address. Zero means 127.0.0.1:8080.
	Addr string
	// RandomDispatch sends every task through one common FIFO to any free worker: the
	// baseline the benchmark compares against. It overrides Scheduler.Policy.
	RandomDispatch bool
	// Scheduler tunes routing; see scheduler.Config for its defaults.
	Scheduler scheduler.Config

	// TaskTimeout is the deadline of a task that names no timeout_ms. Zero means 5m.
	TaskTimeout time.Duration
	// ShutdownTimeout bounds how long shutdown waits for in-flight tasks before
	// failing them with 503. Zero means 30s.
	ShutdownTimeout time.Duration
	// UploaderURL is where POST /upload-model is forwarded; empty answers 503.
	UploaderURL string

	// MaxBodyBytes bounds a /run-task or /upload-model body (413 beyond). Zero means
	// 1 MiB.
	MaxBodyBytes int64
	// BodyReadTimeout bounds how long a request, its body included, may take to arrive
	// from its first byte (Run's http.Server ReadTimeout; a program serving Handler
	// sets its own): a body that stalls is answered 408 (/run-task, /upload-model) or
	// its connection closed, instead of holding a handler and a buffer for ever. It
	// does not bound a synchronous producer's wait for its answer (the body is in by
	// then) nor worker connections, which set deadlines of their own. Zero means 30s.
	BodyReadTimeout time.Duration
	// IdleTimeout closes a kept-alive HTTP connection that has waited this long for its
	// next request (Run's server). Zero means 2m: longer than Go's and most clients'
	// own idle timeouts (90s), so a client normally closes first.
	IdleTimeout time.Duration
	// MaxParamsBytes bounds a task's parameters once decoded (413 beyond). Zero means
	// 1 MiB.
	MaxParamsBytes int
	// MaxQueued bounds the tasks waiting for a worker (429 beyond). Zero means 100000.
	MaxQueued int
	// MaxQueuedPerLabel bounds the tasks waiting for one label (429 beyond), so that
	// one flooded label cannot fill the whole queue. Zero means MaxQueued (no bound of
	// its own).
	MaxQueuedPerLabel int
	// TaskRetention is how long a finished task stays visible to GET /tasks/{id} and
	// answers a resubmission of its id. Zero means 10m.
	TaskRetention time.Duration
	// TaskRetentionCount bounds how many finished tasks are kept in memory. Zero means
	// 100000.
	TaskRetentionCount int
	// TaskRetentionBytes bounds the memory of the finished tasks kept (their results
	// and errors, plus a fixed cost per task): results of up to a frame each, 100,000
	// of them could otherwise take gigabytes. The oldest go first; journaled ones are
	// still answered from the journal. Zero means 256 MiB.
	TaskRetentionBytes int64

	// DataDir holds the journal of tasks accepted asynchronously (202): they survive a
	// crash and run when the dispatcher starts again. Empty means no journal, and a
	// crash loses them (the command's default is ./data).
	DataDir string
	// JournalLockTimeout bounds the wait for the journal's file lock, which another
	// dispatcher on the same DataDir holds. Zero means 1s.
	JournalLockTimeout time.Duration
	// JournalSweepInterval is how often expired answers are deleted from the journal,
	// JournalSweepLimit of them per transaction, as many transactions as it takes.
	// Zero means 1s and 10000.
	JournalSweepInterval time.Duration
	JournalSweepLimit    int

	// SendQueueFrames bounds the frames queued for one worker; a worker that falls
	// this far behind is disconnected. Zero means 1024.
	SendQueueFrames int
	// WriteTimeout is the deadline of every write to a worker. Zero means 10s.
	WriteTimeout time.Duration
	// PingInterval is how often a worker is pinged; a worker silent for 2.5 intervals
	// is dropped. Zero means 10s.
	PingInterval time.Duration
	// HelloTimeout bounds the wait for a new worker's hello. Zero means 10s.
	HelloTimeout time.Duration
	// MaxFrameBytes is the read limit of a worker connection. Zero means 16 MiB.
	MaxFrameBytes int64

	// WorkerTokens are the bearer tokens accepted on /worker-listen. With neither
	// WorkerTokens nor WorkerTokensFile, workers connect without credentials.
	WorkerTokens []string
	// WorkerTokensFile holds more worker tokens, one per line (# comments); a token
	// followed by worker-id=<id> fields serves only those ids (a trailing * is a
	// prefix). It is re-read by ReloadCredentials. Empty means none. A file, even empty,
	// turns worker auth on.
	WorkerTokensFile string
	// APIKeys are the producer keys accepted on the task endpoints (Authorization:
	// Bearer or X-API-Key). With neither APIKeys nor APIKeysFile, producers need none.
	APIKeys []string
	// APIKeysFile holds more API keys, one per line; re-read by ReloadCredentials.
	APIKeysFile string
	// OpsAuth makes the ops endpoints (/workers, /labels, /metrics) require an API key
	// too; /health never does. False means they are open. Needs API keys. It does not
	// cover pprof, which cmd/dispatcher serves on a listener of its own (--pprof-addr).
	OpsAuth bool
	// InsecureNoAuth allows a non-loopback Addr without both worker tokens and API
	// keys. False means such an Addr is refused by New.
	InsecureNoAuth bool
	// TLSCert and TLSKey are PEM files; with both set, Run serves HTTPS and wss://.
	// Empty means plain HTTP.
	TLSCert string
	TLSKey  string

	// MetricsMaxLabels bounds the labels that get series of their own in /metrics; tasks
	// of further labels are counted under label="other", so that a fleet with many
	// labels cannot swamp Prometheus. Zero means 500.
	MetricsMaxLabels int

	// Logger receives the dispatcher's logs. Zero means a disabled logger.
	Logger zerolog.Logger
	// Clock is the scheduler's time source. Nil means the wall clock.
	Clock scheduler.Clock

	// onWait, when set, is told when a synchronous producer starts waiting on a task.
	// For tests.
	onWait func(taskID string)
	// onAsyncAdmitted, when set, is called for an asynchronous task once it is admitted,
	// before its producer is answered: tests run the task to its end there.
	onAsyncAdmitted func(taskID string)
	// onJournalAccept and onJournalForget, when set, are called by an asynchronous
	// submission after its journal write, and before it deletes the record of a task it
	// was then refused: tests hold submissions there to build interleavings.
	onJournalAccept func(taskID string, created bool)
	onJournalForget func(taskID string)
	// journalWriteFault, when set, fails the journal's writes with its error;
	// journalRetry paces the writes of answers again. For tests of a failing disk.
	journalWriteFault func() error
	journalRetry      func() backoff.BackOff
	// onViewChunk, when set, is called after each chunk of a fleet walk, with the
	// hub's lock released (walkWorkers).
	onViewChunk func()
}

// WithDefaults returns the config with zero fields replaced by their defaults.
func (c Config) WithDefaults() Config {
	if c.Addr == "" {
		c.Addr = "127.0.0.1:8080"
	}
	// A base URL written with a trailing slash: /upload-model is joined to it.
	c.UploaderURL = strings.TrimRight(c.UploaderURL, "/")
	if c.RandomDispatch {
		c.Scheduler.Policy = scheduler.PolicyRandom
	}
	c.Scheduler = c.Scheduler.WithDefaults()
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.TaskTimeout, 5*time.Minute)
	def(&c.ShutdownTimeout, 30*time.Second)
	def(&c.BodyReadTimeout, 30*time.Second)
	def(&c.IdleTimeout, 2*time.Minute)
	def(&c.TaskRetention, 10*time.Minute)
	def(&c.WriteTimeout, 10*time.Second)
	def(&c.PingInterval, 10*time.Second)
	def(&c.HelloTimeout, 10*time.Second)
	def(&c.JournalLockTimeout, time.Second)
	def(&c.JournalSweepInterval, time.Second)
	if c.JournalSweepLimit == 0 {
		c.JournalSweepLimit = 10_000
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.MaxQueued == 0 {
		c.MaxQueued = 100_000
	}
	if c.MaxQueuedPerLabel == 0 {
		c.MaxQueuedPerLabel = c.MaxQueued
	}
	if c.MaxParamsBytes == 0 {
		c.MaxParamsBytes = 1 << 20
	}
	if c.TaskRetentionCount == 0 {
		c.TaskRetentionCount = 100_000
	}
	if c.TaskRetentionBytes == 0 {
		c.TaskRetentionBytes = 256 << 20
	}
	if c.MetricsMaxLabels == 0 {
		c.MetricsMaxLabels = 500
	}
	if c.SendQueueFrames == 0 {
		c.SendQueueFrames = 1024
	}
	if c.MaxFrameBytes == 0 {
		c.MaxFrameBytes = frame.DefaultMaxSize
	}
	if c.Clock == nil {
		c.Clock = wallClock{}
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	positive := func(name string, v int64) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %d", name, v))
		}
	}
	positive("TaskTimeout", int64(c.TaskTimeout))
	positive("ShutdownTimeout", int64(c.ShutdownTimeout))
	positive("BodyReadTimeout", int64(c.BodyReadTimeout))
	positive("IdleTimeout", int64(c.IdleTimeout))
	positive("TaskRetention", int64(c.TaskRetention))
	positive("WriteTimeout", int64(c.WriteTimeout))
	positive("PingInterval", int64(c.PingInterval))
	positive("HelloTimeout", int64(c.HelloTimeout))
	positive("MaxBodyBytes", c.MaxBodyBytes)
	positive("MaxQueued", int64(c.MaxQueued))
	positive("MaxQueuedPerLabel", int64(c.MaxQueuedPerLabel))
	positive("MaxParamsBytes", int64(c.MaxParamsBytes))
	positive("TaskRetentionCount", int64(c.TaskRetentionCount))
	positive("TaskRetentionBytes", c.TaskRetentionBytes)
	positive("SendQueueFrames", int64(c.SendQueueFrames))
	positive("MaxFrameBytes", c.MaxFrameBytes)
	if c.MaxFrameBytes > 0 && c.MaxFrameBytes < frame.MinMaxSize {
		// Workers keep their results within it, less 4 KiB for a result's other fields.
		errs = append(errs, fmt.Errorf("MaxFrameBytes (%d) must be at least %d: a worker's result must fit beside its other fields", c.MaxFrameBytes, frame.MinMaxSize))
	}
	positive("MetricsMaxLabels", int64(c.MetricsMaxLabels))
	positive("JournalLockTimeout", int64(c.JournalLockTimeout))
	positive("JournalSweepInterval", int64(c.JournalSweepInterval))
	positive("JournalSweepLimit", int64(c.JournalSweepLimit))
	if c.UploaderURL != "" {
		if u, err := url.Parse(c.UploaderURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("UploaderURL %q must be an http(s) URL", c.UploaderURL))
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, fmt.Errorf("TLSCert and TLSKey must be set together (got TLSCert %q, TLSKey %q)", c.TLSCert, c.TLSKey))
	}
	if c.OpsAuth && len(c.APIKeys) == 0 && c.APIKeysFile == "" {
		errs = append(errs, errors.New("OpsAuth needs APIKeys or APIKeysFile: the ops endpoints would accept no key"))
	}
	if err := c.checkExposure(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }
