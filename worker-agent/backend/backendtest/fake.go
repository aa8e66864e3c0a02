// Package backendtest provides a fake backend for tests: hooks decide how loads and
// runs behave, and the fake records what the agent asked for and any breach of the
// Backend contract (a run on an unloaded label, an unload under a running task,
// overlapping operations on one label, more labels than allowed).
package backendtest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/smartroute/smartroute/worker-agent/backend"
)

// Fake is a controllable backend. Set the exported fields before the agent uses it.
type Fake struct {
	// OnLoad, when set, runs inside Load; its error fails the load.
	OnLoad func(ctx context.Context, label string) error
	// OnUnload, when set, runs inside Unload; its error fails the unload and leaves
	// the label loaded.
	OnUnload func(ctx context.Context, label string) error
	// OnRun, when set, produces Run's answer; nil echoes the task id and label as JSON.
	OnRun func(ctx context.Context, task backend.Task) ([]byte, error)
	// Inv is what Inventory reports.
	Inv backend.Inventory
	// MaxLoaded, when positive, is the most labels that may be loaded or loading at
	// once; more is recorded as a violation.
	MaxLoaded int

	mu         sync.Mutex
	health     error
	loaded     map[string]bool
	inProgress map[string]int // loads and unloads under way, per label
	running    map[string]int // runs under way, per label
	loads      map[string]int // loads started, per label
	unloads    []string
	violations []string
}

var _ backend.Backend = (*Fake)(nil)

// New returns a fake that can load any label, instantly.
func New() *Fake {
	return &Fake{
		loaded:     make(map[string]bool),
		inProgress: make(map[string]int),
		running:    make(map[string]int),
		loads:      make(map[string]int),
	}
}

// Name returns "fake".
func (f *Fake) Name() string { return "fake" }

// Inventory returns f.Inv.
func (f *Fake) Inventory(context.Context) (backend.Inventory, error) { return f.Inv, nil }

// SetHealth sets what Health returns; nil means available.
func (f *Fake) SetHealth(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.health = err
}

// Health returns what SetHealth set.
func (f *Fake) Health(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.health
}

// Load runs OnLoad and marks the label loaded when it succeeds.
func (f *Fake) Load(ctx context.Context, label string) error {
	f.mu.Lock()
	f.loads[label]++
	if f.inProgress[label] > 0 {
		f.violate("load of %q while another operation on it is under way", label)
	}
	f.inProgress[label]++
	if f.MaxLoaded > 0 && f.occupiedLocked() > f.MaxLoaded {
		f.violate("load of %q makes %d labels, more than %d", label, f.occupiedLocked(), f.MaxLoaded)
	}
	f.mu.Unlock()
	var err error
	if f.OnLoad != nil {
		err = f.OnLoad(ctx, label)
	}
	f.mu.Lock()
	f.inProgress[label]--
	if err == nil {
		f.loaded[label] = true
	}
	f.mu.Unlock()
	return err
}

// occupiedLocked counts labels loaded or being loaded.
func (f *Fake) occupiedLocked() int {
	n := len(f.loaded)
	for l, c := range f.inProgress {
		if c > 0 && !f.loaded[l] {
			n++
		}
	}
	return n
}

// Unload runs OnUnload and marks the label not loaded when it succeeds.
func (f *Fake) Unload(ctx context.Context, label string) error {
	f.mu.Lock()
	if f.running[label] > 0 {
		f.violate("unload of %q while %d task(s) run on it", label, f.running[label])
	}
	if f.inProgress[label] > 0 {
		f.violate("unload of %q while another operation on it is under way", label)
	}
	f.unloads = append(f.unloads, label)
	f.mu.Unlock()
	if f.OnUnload != nil {
		if err := f.OnUnload(ctx, label); err != nil {
			return err
		}
	}
	f.mu.Lock()
	delete(f.loaded, label)
	f.mu.Unlock()
	return nil
}

// Run runs OnRun on a loaded label.
func (f *Fake) Run(ctx context.Context, task backend.Task) ([]byte, error) {
	f.mu.Lock()
	if !f.loaded[task.Label] {
		f.mu.Unlock()
		return nil, fmt.Errorf("%w: %q", backend.ErrNotLoaded, task.Label)
	}
	f.running[task.Label]++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running[task.Label]--
		f.mu.Unlock()
	}()
	if f.OnRun != nil {
		return f.OnRun(ctx, task)
	}
	return json.Marshal(map[string]string{"task_id": task.ID, "label": task.Label})
}

func (f *Fake) violate(format string, args ...any) {
	f.violations = append(f.violations, fmt.Sprintf(format, args...))
}

// Loads returns how many loads of label were started.
func (f *Fake) Loads(label string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loads[label]
}

// Unloads returns the labels unloaded, in order.
func (f *Fake) Unloads() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.unloads)
}

// Loaded returns the labels loaded now, sorted.
func (f *Fake) Loaded() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for l := range f.loaded {
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}

// Violations returns the contract breaches seen so far.
func (f *Fake) Violations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.violations)
}
