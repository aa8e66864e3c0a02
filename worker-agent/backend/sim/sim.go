// Package sim is the simulated backend: loading a label and running a task only take
// time. Durations are drawn from a seeded source so that a run can be reproduced, and
// zero durations cost nothing at all (no timer), which the throughput benchmark relies on.
package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/smartroute/smartroute/worker-agent/backend"
)

// Name is the backend name used in --backend and in the hello's agent string.
const Name = "sim"

// Config sets the simulated durations. Zero values are meaningful: a zero time makes
// loads or runs instant and a zero jitter makes every duration exactly the set time.
type Config struct {
	// WorkerID is echoed in every result; empty leaves the field empty.
	WorkerID string
	// LoadTime is how long a load takes; zero means instant.
	LoadTime time.Duration
	// LoadJitter is the largest absolute deviation from LoadTime, drawn uniformly in
	// [-LoadJitter, +LoadJitter]; zero means none. A drawn duration below zero is zero.
	LoadJitter time.Duration
	// RunTime is how long a task runs; zero means instant.
	RunTime time.Duration
	// RunJitter is the largest absolute deviation from RunTime, as LoadJitter.
	RunJitter time.Duration
	// Seed seeds the source of the jitter; every value, zero included, is a valid seed.
	// The same seed and the same sequence of calls give the same durations.
	Seed int64
	// Sleep waits d or until ctx is done, returning ctx's error in that case. Nil
	// means a real sleep, precise to a fraction of a millisecond (preciseSleep). Tests
	// inject one that records durations without waiting.
	// It is never called for a zero duration.
	Sleep func(ctx context.Context, d time.Duration) error
}

// MaxDuration bounds each simulated time and jitter: far above any load or run worth
// simulating, and far below where base ± jitter would overflow.
const MaxDuration = 24 * time.Hour

func (c Config) validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"LoadTime", c.LoadTime}, {"LoadJitter", c.LoadJitter}, {"RunTime", c.RunTime}, {"RunJitter", c.RunJitter}} {
		if f.d < 0 || f.d > MaxDuration {
			return fmt.Errorf("sim %s must be between 0 and %s, got %s", f.name, MaxDuration, f.d)
		}
	}
	return nil
}

// Backend is the simulated backend. It tracks which labels are loaded, so that a run on
// a label that was never loaded fails as it would on a real backend.
type Backend struct {
	cfg   Config
	sleep func(ctx context.Context, d time.Duration) error

	mu     sync.Mutex          // guards rng and loaded
	rng    *rand.Rand          // jitter source
	loaded map[string]struct{} // labels loaded now
}

var _ backend.Backend = (*Backend)(nil)

// New returns a simulated backend.
func New(cfg Config) (*Backend, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sleep := cfg.Sleep
	if sleep == nil {
		sleep = preciseSleep
	}
	seed := uint64(cfg.Seed)
	return &Backend{
		cfg:    cfg,
		sleep:  sleep,
		rng:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		loaded: make(map[string]struct{}),
	}, nil
}

// Name returns "sim".
func (b *Backend) Name() string { return Name }

// Inventory reports that any label can be loaded and none is loaded yet.
func (b *Backend) Inventory(context.Context) (backend.Inventory, error) {
	return backend.Inventory{}, nil
}

// Health always reports the simulated backend available.
func (b *Backend) Health(context.Context) error { return nil }

// Load waits the load time and marks the label loaded.
func (b *Backend) Load(ctx context.Context, label string) error {
	if label == "" {
		return errors.New("empty label")
	}
	if err := b.wait(ctx, b.cfg.LoadTime, b.cfg.LoadJitter); err != nil {
		return err
	}
	b.mu.Lock()
	b.loaded[label] = struct{}{}
	b.mu.Unlock()
	return nil
}

// Unload marks the label not loaded; it takes no time and cannot fail.
func (b *Backend) Unload(_ context.Context, label string) error {
	b.mu.Lock()
	delete(b.loaded, label)
	b.mu.Unlock()
	return nil
}

// result is what a simulated run returns: the task, echoed.
type result struct {
	TaskID         string `json:"task_id"`
	TaskType       string `json:"task_type"`
	Label          string `json:"label"`
	WorkerID       string `json:"worker_id"`
	ParametersJSON string `json:"parameters_json"`
}

// Run waits the run time and returns the task echoed as JSON. It accepts any task type.
func (b *Backend) Run(ctx context.Context, task backend.Task) ([]byte, error) {
	b.mu.Lock()
	_, ok := b.loaded[task.Label]
	b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", backend.ErrNotLoaded, task.Label)
	}
	if err := b.wait(ctx, b.cfg.RunTime, b.cfg.RunJitter); err != nil {
		return nil, err
	}
	return appendResult(make([]byte, 0, 96+len(task.ID)+len(task.Type)+len(task.Label)+len(b.cfg.WorkerID)+len(task.Params)*5/4), task, b.cfg.WorkerID), nil
}

// appendResult encodes the echo of a task. Every task a simulated fleet runs goes
// through here, so it avoids reflection: encoding/json was an eighth of an agent's
// CPU per task in the throughput benchmark. TestResultEncoding holds it to
// encoding/json's output.
func appendResult(b []byte, task backend.Task, workerID string) []byte {
	b = append(b, `{"task_id":`...)
	b = appendString(b, task.ID)
	b = append(b, `,"task_type":`...)
	b = appendString(b, task.Type)
	b = append(b, `,"label":`...)
	b = appendString(b, task.Label)
	b = append(b, `,"worker_id":`...)
	b = appendString(b, workerID)
	b = append(b, `,"parameters_json":`...)
	b = appendString(b, task.Params)
	return append(b, '}')
}

// appendString appends s as a JSON string, in one pass: printable ASCII takes the
// quick way, with only quotes and backslashes escaped; a string with anything else
// is encoding/json's.
func appendString[S string | []byte](b []byte, s S) []byte {
	mark := len(b)
	b = append(b, '"')
	start := 0 // copied in runs between escapes, not byte by byte
	for i := 0; i < len(s); i++ {
		switch c := s[i]; stringBytes[c] {
		case plainByte:
		case escapedByte:
			b = append(b, s[start:i]...)
			b = append(b, '\\', c)
			start = i + 1
		default:
			q, _ := json.Marshal(string(s))
			return append(b[:mark], q...)
		}
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// How appendString treats each byte.
const (
	plainByte   = iota // copied as is
	escapedByte        // after a backslash
	slowByte           // control, non-ASCII or HTML-escaped: the string is encoding/json's
)

var stringBytes = func() (t [256]uint8) {
	for c := range t {
		switch {
		case c == '"' || c == '\\':
			t[c] = escapedByte
		case c < 0x20 || c > 0x7e || c == '<' || c == '>' || c == '&':
			t[c] = slowByte
		}
	}
	return t
}()

// Loaded reports whether label is loaded now.
func (b *Backend) Loaded(label string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.loaded[label]
	return ok
}

func (b *Backend) wait(ctx context.Context, base, jitter time.Duration) error {
	d := b.duration(base, jitter)
	if d <= 0 {
		return ctx.Err()
	}
	return b.sleep(ctx, d)
}

// duration draws base ± jitter, never below zero.
func (b *Backend) duration(base, jitter time.Duration) time.Duration {
	if jitter <= 0 {
		return base
	}
	b.mu.Lock()
	delta := time.Duration(b.rng.Int64N(2*int64(jitter)+1)) - jitter
	b.mu.Unlock()
	return max(base+delta, 0)
}
