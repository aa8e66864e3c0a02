package live

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/smartroute/smartroute/benchmark/producer"
)

// Config is one `benchmark run`. DefaultConfig holds the seed's defaults; fields whose
// zero value means something else say so. Validation errors name the command-line
// flag of the field.
type Config struct {
	// RepoDir is the repository the binaries are built from (--repo); Validate checks
	// that it holds go.work. Zero means the nearest directory holding go.work at or
	// above the working directory.
	RepoDir string
	// BinDir holds prebuilt "dispatcher", "worker-agent", "log-collector" and, for the
	// triton backend, "fake-triton" binaries (--bin-dir); Validate checks that they are
	// there. Zero means build them from RepoDir into a temporary directory removed at
	// the end.
	BinDir string
	// OutDir receives each run's logs and records, one subdirectory per mode (--out).
	// Zero means a new directory under os.TempDir.
	OutDir string

	// NumWorkers is how many worker agents run (--num-workers, NUM_WORKERS).
	NumWorkers int
	// MaxLabels and Slots are each agent's label capacity and concurrent tasks
	// (--max-labels, --slots).
	MaxLabels, Slots int
	// RandomDispatch runs the dispatcher's random baseline instead of label routing
	// (--random-dispatch, RANDOM_DISPATCH). Ignored with Compare.
	RandomDispatch bool
	// Compare runs routing, then random dispatch, with the same seed (--compare).
	Compare bool
	// LogLevel is the dispatcher's --log-level (--log-level), and the agents' when it
	// is debug or trace; the agents never log quieter than info, the level of the
	// records the summary reads. Zero means "info".
	LogLevel string
	// TaskTimeout is passed to the dispatcher as --task-timeout (--task-timeout). Zero
	// means the flag is not passed and the dispatcher's default applies.
	TaskTimeout time.Duration
	// Backend is the agents' backend (--backend, BACKEND): BackendSim, or
	// BackendTriton, which starts a fake Triton beside each agent (loads take
	// SimLoadTime there; runs are the fake's real inference calls). Zero means sim.
	Backend string
	// SimLoadTime, SimLoadJitter, SimRunTime and SimRunJitter drive the agents'
	// simulated backend, before TimeScale (--sim-load-time, --sim-load-jitter,
	// --sim-run-time, --sim-run-jitter).
	SimLoadTime, SimLoadJitter, SimRunTime, SimRunJitter time.Duration

	// Requests is the total number of requests (--requests).
	Requests int
	// Producers is the number of concurrent closed-loop producers (--producers).
	Producers int
	// WaitAvg and WaitStddev shape each producer's pause after a request: the seed's
	// max(100 ms, normal(WaitAvg, WaitStddev)), before TimeScale (--wait-avg,
	// --wait-stddev, in seconds on the command line).
	WaitAvg, WaitStddev time.Duration
	// Labels is the number of labels, named label-1 to label-N (--labels).
	Labels int
	// TaskTypes are chosen uniformly per request (--task-types, comma-separated).
	// Zero means sample_task, or infer with BackendTriton.
	TaskTypes []string
	// Parameters is every task's parameters_json (--parameters). Zero means the
	// seed's {"data": "sample"}, or a small KServe v2 infer body with BackendTriton.
	Parameters string
	// SyncShare is the share of synchronous requests (--sync-share).
	SyncShare float64
	// Seed drives the producers and, offset per worker, the agents (--seed).
	Seed int64
	// TimeScale multiplies every duration of the workload: pauses, and the simulated
	// load and run times (--time-scale).
	TimeScale float64
	// RequestTimeout bounds one request, polling included (--request-timeout). Zero
	// means no bound.
	RequestTimeout time.Duration

	// ReadyTimeout bounds the wait for the dispatcher's health and the workers'
	// connections (--ready-timeout). Zero means 30 s.
	ReadyTimeout time.Duration
	// StopTimeout is how long a process may take to exit after SIGTERM before it is
	// killed (--stop-timeout). Zero means 10 s.
	StopTimeout time.Duration

	// JSON writes the result as JSON instead of text (--json).
	JSON bool
	// ChartPath, when set, receives an SVG chart of the comparison (--chart); it
	// needs Compare.
	ChartPath string
	// Progress receives a progress bar during the requests. Zero means none.
	Progress io.Writer
	// Logger receives the runner's own log. Zero means no log.
	Logger zerolog.Logger

	// onProcessStart, when set, is told of every child process started. For tests.
	onProcessStart func(*process)
}

// DefaultConfig is the seed's benchmark: 2 workers holding 2 labels each, 10
// requests from 2 producers pausing 1 ± 0.5 s, 4 labels, a 400 ms load and a 50 ms run.
func DefaultConfig() Config {
	return Config{
		NumWorkers:     2,
		MaxLabels:      2,
		Slots:          1,
		LogLevel:       "info",
		SimLoadTime:    400 * time.Millisecond,
		SimLoadJitter:  50 * time.Millisecond,
		SimRunTime:     50 * time.Millisecond,
		SimRunJitter:   10 * time.Millisecond,
		Requests:       10,
		Producers:      2,
		WaitAvg:        time.Second,
		WaitStddev:     500 * time.Millisecond,
		Labels:         4,
		SyncShare:      1,
		Seed:           1,
		TimeScale:      1,
		RequestTimeout: 2 * time.Minute,
		ReadyTimeout:   30 * time.Second,
		StopTimeout:    10 * time.Second,
	}
}

// Backends of the agents.
const (
	BackendSim    = "sim"
	BackendTriton = "triton"
)

// MinTimeScale is the smallest --time-scale: 400 ms loads become 400 ns.
const MinTimeScale = 1e-6

// tritonInferBody is a KServe v2 infer request the fake Triton answers for any model.
const tritonInferBody = `{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}`

func (c Config) withDefaults() Config {
	if c.Backend == "" {
		c.Backend = BackendSim
	}
	if len(c.TaskTypes) == 0 {
		c.TaskTypes = []string{"sample_task"}
		if c.Backend == BackendTriton {
			c.TaskTypes = []string{"infer"}
		}
	}
	if c.Parameters == "" && c.Backend == BackendTriton {
		c.Parameters = tritonInferBody
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 30 * time.Second
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = 10 * time.Second
	}
	return c
}

// ErrConfig is matched (errors.Is) by the errors of Run, Measure and BatchCompare that
// come from their settings, found before anything starts: bad usage, not a failed run.
var ErrConfig = errors.New("benchmark config")

// configError marks err as ErrConfig without adding to its message, which already
// names the flag.
type configError struct{ error }

func (e configError) Is(target error) bool { return target == ErrConfig }
func (e configError) Unwrap() error        { return e.error }

// Validate checks c; each error names the flag to fix.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	atLeast1 := func(flag string, v int) {
		if v < 1 {
			bad("%s must be at least 1, got %d", flag, v)
		}
	}
	notNegative := func(flag string, d time.Duration) {
		if d < 0 {
			bad("%s must not be negative, got %v", flag, d)
		}
	}
	atLeast1("--requests", c.Requests)
	atLeast1("--producers", c.Producers)
	atLeast1("--num-workers (NUM_WORKERS)", c.NumWorkers)
	atLeast1("--max-labels", c.MaxLabels)
	atLeast1("--slots", c.Slots)
	atLeast1("--labels", c.Labels)
	notNegative("--wait-avg", c.WaitAvg)
	notNegative("--wait-stddev", c.WaitStddev)
	notNegative("--sim-load-time", c.SimLoadTime)
	notNegative("--sim-load-jitter", c.SimLoadJitter)
	notNegative("--sim-run-time", c.SimRunTime)
	notNegative("--sim-run-jitter", c.SimRunJitter)
	notNegative("--task-timeout", c.TaskTimeout)
	notNegative("--request-timeout", c.RequestTimeout)
	notNegative("--ready-timeout", c.ReadyTimeout)
	notNegative("--stop-timeout", c.StopTimeout)
	if !(c.SyncShare >= 0 && c.SyncShare <= 1) {
		bad("--sync-share must be within [0, 1], got %v", c.SyncShare)
	}
	if !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0) {
		bad("--time-scale must be a positive number, got %v", c.TimeScale)
	} else if c.TimeScale < MinTimeScale {
		// Every duration would round to nothing, and the report's figures at scale 1
		// (divided by the scale) would overflow.
		bad("--time-scale must be at least %v, got %v", MinTimeScale, c.TimeScale)
	} else {
		// The scale multiplies the workload's durations: each must still fit a Duration.
		for _, d := range []struct {
			flag string
			d    time.Duration
		}{
			{"--wait-avg", c.WaitAvg}, {"--wait-stddev", c.WaitStddev}, {"the least pause", producer.MinWait},
			{"--sim-load-time", c.SimLoadTime}, {"--sim-load-jitter", c.SimLoadJitter},
			{"--sim-run-time", c.SimRunTime}, {"--sim-run-jitter", c.SimRunJitter},
		} {
			if math.Abs(float64(d.d)*c.TimeScale) >= math.MaxInt64 {
				bad("--time-scale %v makes %s (%v) too long for a duration", c.TimeScale, d.flag, d.d)
				break
			}
		}
	}
	switch c.Backend {
	case "", BackendSim, BackendTriton:
	default:
		bad("--backend (BACKEND) must be sim or triton, got %q", c.Backend)
	}
	for _, t := range c.TaskTypes {
		if strings.TrimSpace(t) == "" {
			bad("--task-types must not hold an empty name, got %q", strings.Join(c.TaskTypes, ","))
			break
		}
	}
	// The dispatcher refuses every task whose parameters_json holds no JSON document.
	if c.Parameters != "" && !json.Valid([]byte(c.Parameters)) {
		bad("--parameters must be JSON, got %q", c.Parameters)
	}
	if c.LogLevel != "" {
		if _, err := zerolog.ParseLevel(c.LogLevel); err != nil {
			bad("--log-level: %v", err)
		}
	}
	if c.ChartPath != "" && !c.Compare {
		bad("--chart needs --compare")
	}
	if c.RepoDir != "" && c.BinDir != "" {
		bad("--repo and --bin-dir exclude each other: --bin-dir uses prebuilt binaries")
	} else {
		errs = append(errs, c.checkSource())
	}
	return errors.Join(errs...)
}

// checkSource checks that --bin-dir holds the binaries, or --repo the repository to
// build them from. A wrong path is a mistake in the command: found here, it is bad
// usage refused before anything starts, not a run that fails once it gets there.
func (c Config) checkSource() error {
	switch {
	case c.BinDir != "":
		_, err := prebuilt(c.BinDir, c.Backend)
		return err
	case c.RepoDir != "":
		if _, err := os.Stat(filepath.Join(c.RepoDir, "go.work")); err != nil {
			return fmt.Errorf("--repo %s: not the repository's root (no go.work there): %w", c.RepoDir, err)
		}
	}
	return nil
}
