package agent

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/proto/frame"
	"github.com/smartroute/smartroute/worker-agent/backend"
	"github.com/smartroute/smartroute/worker-agent/backend/sim"
	"github.com/smartroute/smartroute/worker-agent/backend/triton"
)

// Defaults filled in by WithDefaults.
const (
	DefaultDispatcherURL     = "ws://127.0.0.1:8080/worker-listen"
	DefaultMaxLabels         = 2
	DefaultSlots             = 1
	DefaultBackendName       = sim.Name
	DefaultLogLevel          = "info"
	DefaultDrainTimeout      = 30 * time.Second
	DefaultHandshakeTimeout  = 10 * time.Second
	DefaultWriteTimeout      = 10 * time.Second
	DefaultReadTimeout       = 60 * time.Second
	DefaultPingInterval      = 20 * time.Second
	DefaultReconnectMin      = 100 * time.Millisecond
	DefaultReconnectMax      = 5 * time.Second
	DefaultBackoffResetAfter = 10 * time.Second
	DefaultHealthInterval    = 5 * time.Second
	DefaultInventoryInterval = 30 * time.Second
	DefaultSendQueueSize     = 256
)

// MinMaxFrameSize is the smallest MaxFrameSize: resultOverhead of each result frame is
// kept for its other fields, and a frame much smaller leaves a result no room at all
// (every task would fail with "does not fit in a frame"). The dispatcher's limit has
// the same floor.
const MinMaxFrameSize = frame.MinMaxSize

// MaxCapacity bounds Slots and MaxLabels: the hello carries them as uint32, and a
// worker with more is a typo, not a machine.
const MaxCapacity = frame.MaxCapacity

// ErrConfig is wrapped by Run's error for a config it refuses (cmd/worker-agent exits
// 2 on it, as on a bad flag).
var ErrConfig = errors.New("invalid config")

// Config configures Run. Each field's comment says what its zero value means; call
// WithDefaults to fill them in (Run does).
type Config struct {
	// DispatcherURL is the dispatcher's worker WebSocket (ws:// or wss://). Empty means
	// DefaultDispatcherURL.
	DispatcherURL string
	// WorkerToken is sent as "Authorization: Bearer <token>" on every dial, and to the
	// log collector. Empty means none (a dispatcher without worker auth).
	WorkerToken string
	// CAFile is a PEM bundle of the CAs trusted for wss:// dispatcher and log collector
	// URLs, in place of the system roots. Empty means the system roots.
	CAFile string
	// WorkerID names this worker, in the Worker-Id header and the hello. Empty means the
	// host name plus a short random suffix ("host-3f9a1c").
	WorkerID string
	// MaxLabels is how many labels the worker holds at once. Zero means 2.
	MaxLabels int
	// Slots is how many tasks the worker runs at once. Zero means 1.
	Slots int
	// Labels restricts the labels this worker will load; empty means any label the
	// backend can load. Sent in the hello as loadable_labels (intersected with what the
	// backend reports).
	Labels []string

	// BackendName picks the backend: "sim" (simulated) or "triton" (a Triton server at
	// Triton.URL). Empty means "sim".
	// Ignored when Backend is set.
	BackendName string
	// Backend, when set, is used instead of building one from BackendName (tests, or a
	// program embedding the agent).
	Backend backend.Backend
	// Sim configures the simulated backend. Its zero value is instant loads and runs;
	// Sim.WorkerID is filled in from WorkerID when empty.
	Sim sim.Config
	// Triton configures the Triton backend; its zero value is documented field by field
	// in triton.Config (http://127.0.0.1:8000, 10m load timeout, input "TEXT", output
	// "sentence_embedding", ...). Its Log is set by the agent.
	Triton triton.Config

	// LogLevel is a zerolog level name (debug, info, warn, error). Empty means info.
	LogLevel string
	// Agents is how many agents cmd/worker-agent runs in one process (RunMany); zero
	// means one. Run ignores it.
	Agents int
	// CPUProfile, when set, is where cmd/worker-agent writes a pprof CPU profile on
	// exit. Run ignores it.
	CPUProfile string
	// LogOutput receives the JSON log lines. Nil means standard output.
	LogOutput io.Writer
	// MetricsAddr is where RunMany serves /metrics, /healthz and /readyz (and
	// /debug/pprof/ with Pprof). Empty means off. Run ignores it.
	MetricsAddr string
	// Pprof adds /debug/pprof/ to the MetricsAddr server; it needs MetricsAddr. Keep
	// that address private.
	Pprof bool
	// Metrics receives the agent's metrics and answers its readiness; RunMany makes one
	// for MetricsAddr when nil, shared by its agents. Nil (and no MetricsAddr) means
	// none.
	Metrics *Metrics
	// LogCollectorURL is the log collector the agent also streams its log records to
	// (ws://host:8090/ingest; http:// and an empty path are accepted, see
	// logship.IngestURL). Empty means off: the records go to LogOutput only.
	LogCollectorURL string

	// DrainTimeout bounds how long a drain waits for in-flight tasks before it cancels
	// them and leaves their re-queueing to the dispatcher. Zero means 30s.
	DrainTimeout time.Duration
	// HandshakeTimeout bounds the WebSocket upgrade and, separately, the wait for the
	// dispatcher's Welcome after the hello. Zero means 10s.
	HandshakeTimeout time.Duration
	// WriteTimeout is the deadline of every frame write. Zero means 10s.
	WriteTimeout time.Duration
	// ReadTimeout is how long the connection may stay silent (no frame, ping or pong)
	// before it counts as dead. Zero means 60s.
	ReadTimeout time.Duration
	// PingInterval is how often the agent pings the dispatcher, so that the dispatcher's
	// pongs keep the read deadline alive even if it never pings. Zero means 20s; it
	// must be below ReadTimeout.
	PingInterval time.Duration
	// ReconnectMin is the first wait before reconnecting; waits then double, with ±50%
	// jitter, up to ReconnectMax. Zero means 100ms.
	ReconnectMin time.Duration
	// ReconnectMax caps the reconnect wait before jitter. Zero means 5s.
	ReconnectMax time.Duration
	// BackoffResetAfter: a connection that lived this long resets the reconnect wait to
	// ReconnectMin. Zero means 10s.
	BackoffResetAfter time.Duration
	// HealthInterval is how often the backend's Health is polled. Zero means 5s.
	HealthInterval time.Duration
	// InventoryInterval is how often a backend whose repository can change (Triton)
	// is asked which labels it can load; a change is reported to the dispatcher. Zero
	// means 30s.
	InventoryInterval time.Duration
	// SendQueueSize bounds the frames waiting for the writer; a connection whose queue
	// fills up is dropped (the dispatcher re-queues its tasks). Zero means 256.
	SendQueueSize int
	// MaxFrameSize bounds a frame read from the dispatcher and a result sent to it.
	// Zero means frame.DefaultMaxSize (16 MiB). It must be at least MinMaxFrameSize.
	MaxFrameSize int

	hooks *testHooks // set only by this package's tests
}

// testHooks let tests see moments they cannot observe from outside.
type testHooks struct {
	labelJoin func(label string) // an acquire starts waiting for a load another task started
	labelWait func(label string) // an acquire starts waiting for room
	// clock, when set, stands in for time.Now and time.AfterFunc in task deadlines, so
	// that a test decides when a deadline passes.
	clock deadlineClock
}

// WithDefaults returns a copy of c with zero values replaced by their defaults.
func (c Config) WithDefaults() Config {
	if c.DispatcherURL == "" {
		c.DispatcherURL = DefaultDispatcherURL
	}
	if c.WorkerID == "" {
		c.WorkerID = defaultWorkerID()
	}
	if c.MaxLabels == 0 {
		c.MaxLabels = DefaultMaxLabels
	}
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.BackendName == "" {
		c.BackendName = DefaultBackendName
	}
	if c.Sim.WorkerID == "" {
		c.Sim.WorkerID = c.WorkerID
	}
	if c.LogLevel == "" {
		c.LogLevel = DefaultLogLevel
	}
	if c.LogOutput == nil {
		c.LogOutput = os.Stdout
	}
	setDuration(&c.DrainTimeout, DefaultDrainTimeout)
	setDuration(&c.HandshakeTimeout, DefaultHandshakeTimeout)
	setDuration(&c.WriteTimeout, DefaultWriteTimeout)
	setDuration(&c.ReadTimeout, DefaultReadTimeout)
	setDuration(&c.PingInterval, DefaultPingInterval)
	setDuration(&c.ReconnectMin, DefaultReconnectMin)
	setDuration(&c.ReconnectMax, DefaultReconnectMax)
	setDuration(&c.BackoffResetAfter, DefaultBackoffResetAfter)
	setDuration(&c.HealthInterval, DefaultHealthInterval)
	setDuration(&c.InventoryInterval, DefaultInventoryInterval)
	if c.SendQueueSize == 0 {
		c.SendQueueSize = DefaultSendQueueSize
	}
	if c.MaxFrameSize == 0 {
		c.MaxFrameSize = frame.DefaultMaxSize
	}
	return c
}

func setDuration(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

func defaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	return fmt.Sprintf("%s-%06x", host, rand.Uint32()&0xffffff)
}

// validate checks a config that went through WithDefaults; each message names the field.
func (c Config) validate() error {
	var errs []error
	u, err := url.Parse(c.DispatcherURL)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("DispatcherURL %q: %w", c.DispatcherURL, err))
	case u.Scheme != "ws" && u.Scheme != "wss":
		errs = append(errs, fmt.Errorf("DispatcherURL %q must start with ws:// or wss://", c.DispatcherURL))
	case u.Host == "":
		errs = append(errs, fmt.Errorf("DispatcherURL %q has no host", c.DispatcherURL))
	}
	// The dispatcher answers 400 to an id it cannot take, on every dial: refused here,
	// the agent exits 2 instead of retrying for ever.
	if err := frame.CheckWorkerID(c.WorkerID); err != nil {
		errs = append(errs, fmt.Errorf("WorkerID %q: %w", c.WorkerID, err))
	}
	if c.MaxLabels < 1 || c.MaxLabels > MaxCapacity {
		errs = append(errs, fmt.Errorf("MaxLabels must be between 1 and %d, got %d", MaxCapacity, c.MaxLabels))
	}
	if c.Slots < 1 || c.Slots > MaxCapacity {
		errs = append(errs, fmt.Errorf("Slots must be between 1 and %d, got %d", MaxCapacity, c.Slots))
	}
	for i, l := range c.Labels {
		if l == "" || strings.TrimSpace(l) != l {
			errs = append(errs, fmt.Errorf("Labels[%d] %q must be a non-empty label without surrounding spaces", i, l))
		} else if err := frame.CheckLabel(fmt.Sprintf("Labels[%d]", i), l); err != nil {
			errs = append(errs, err) // the dispatcher would refuse the hello
		}
	}
	if c.Backend == nil && c.BackendName != sim.Name && c.BackendName != triton.Name {
		errs = append(errs, fmt.Errorf("BackendName %q is not a known backend (--backend; known: %s, %s)", c.BackendName, sim.Name, triton.Name))
	}
	if c.Backend == nil && c.BackendName == triton.Name {
		if err := c.Triton.WithDefaults().Validate(); err != nil {
			for line := range strings.SplitSeq(err.Error(), "\n") {
				errs = append(errs, errors.New("Triton."+line))
			}
		}
	}
	if _, err := zerolog.ParseLevel(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("LogLevel %q: %w", c.LogLevel, err))
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"DrainTimeout", c.DrainTimeout}, {"HandshakeTimeout", c.HandshakeTimeout},
		{"WriteTimeout", c.WriteTimeout}, {"ReadTimeout", c.ReadTimeout},
		{"PingInterval", c.PingInterval}, {"ReconnectMin", c.ReconnectMin},
		{"ReconnectMax", c.ReconnectMax}, {"BackoffResetAfter", c.BackoffResetAfter},
		{"HealthInterval", c.HealthInterval}, {"InventoryInterval", c.InventoryInterval},
	} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", f.name, f.d))
		}
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"Sim.LoadTime", c.Sim.LoadTime}, {"Sim.LoadJitter", c.Sim.LoadJitter},
		{"Sim.RunTime", c.Sim.RunTime}, {"Sim.RunJitter", c.Sim.RunJitter},
	} {
		if f.d < 0 || f.d > sim.MaxDuration {
			errs = append(errs, fmt.Errorf("%s must be between 0 and %s, got %s", f.name, sim.MaxDuration, f.d))
		}
	}
	if c.PingInterval >= c.ReadTimeout {
		errs = append(errs, fmt.Errorf("PingInterval (%s) must be below ReadTimeout (%s)", c.PingInterval, c.ReadTimeout))
	}
	if c.ReconnectMax < c.ReconnectMin {
		errs = append(errs, fmt.Errorf("ReconnectMax (%s) must not be below ReconnectMin (%s)", c.ReconnectMax, c.ReconnectMin))
	}
	if strings.ContainsAny(c.WorkerToken, " \t\r\n") {
		errs = append(errs, errors.New("WorkerToken must not contain spaces or line breaks"))
	}
	if c.SendQueueSize < 1 {
		errs = append(errs, fmt.Errorf("SendQueueSize must be at least 1, got %d", c.SendQueueSize))
	}
	if c.Pprof && c.MetricsAddr == "" {
		errs = append(errs, errors.New("Pprof (--pprof) needs MetricsAddr (--metrics-addr): pprof is served there"))
	}
	if c.MaxFrameSize < MinMaxFrameSize {
		errs = append(errs, fmt.Errorf("MaxFrameSize must be at least %d (%d of each result's frame are kept for its other fields), got %d",
			MinMaxFrameSize, resultOverhead, c.MaxFrameSize))
	}
	return errors.Join(errs...)
}
