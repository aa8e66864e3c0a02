// Package backend defines what the worker agent needs from an inference backend: load
// and unload labels (models), run tasks on a loaded label, and say what it can load
// and whether it can take work at all. The built-in simulated backend lives in
// backend/sim; the Triton backend in backend/triton.
package backend

import (
	"context"
	"errors"
)

// Backend is an inference backend. The agent calls Load and Unload for one label at a
// time (never Load and Unload of the same label concurrently, never Unload of a label
// a task is running on), and Run only on a label whose Load succeeded. Every method
// must return promptly once its context is done.
type Backend interface {
	// Name is a short identifier for logs and the hello ("sim", "triton").
	Name() string
	// Inventory reports, once at startup, which labels the backend can load and which
	// it holds already.
	Inventory(ctx context.Context) (Inventory, error)
	// Health returns nil when the backend can take tasks now, or an error saying why
	// not (for example "triton is not live"). The agent polls it.
	Health(ctx context.Context) error
	// Load makes label ready to run tasks. Loading a label already loaded is a no-op.
	Load(ctx context.Context, label string) error
	// Unload frees what label holds. Unloading a label not loaded is a no-op; when
	// Unload returns nil, the room is free for another Load. An error may leave the
	// label loaded, and the agent goes on counting it as held, unless it wraps
	// ErrUnloading.
	Unload(ctx context.Context, label string) error
	// Run executes one task on a loaded label and returns its result (JSON for the
	// built-in backends).
	Run(ctx context.Context, task Task) ([]byte, error)
}

// Task is one task attempt as the backend sees it.
type Task struct {
	ID      string
	Attempt uint32
	Type    string
	Label   string
	// Params is the producer's parameters_json, untouched.
	Params []byte
}

// Inventory is what a backend reports at startup.
type Inventory struct {
	// Loadable lists the labels the backend can load; empty means any label.
	Loadable []string
	// Loaded lists the labels loaded already, least recently used first.
	Loaded []string
}

// Repository is implemented by a backend whose loadable labels can change while it
// runs: models added to or removed from Triton's repository. The agent polls it every
// InventoryInterval and tells the dispatcher when the list changes, so that a new
// model is routable without restarting the agent. Loadable has no side effects; an
// empty list means the backend lists none (not "any label", as in Inventory).
type Repository interface {
	Loadable(ctx context.Context) ([]string, error)
}

// Starter is implemented by a backend that may still be starting when the agent does
// (a Triton server loading its preloaded models). The agent calls WaitStarted before
// Inventory and gives up when it returns an error; it returns nil once the backend
// answers, and must return promptly once its context is done.
type Starter interface {
	WaitStarted(ctx context.Context) error
}

// ErrUnavailable is wrapped by the error of a Load or Run that never reached the
// backend (its connection was refused: the server is down or restarting), so that
// nothing was loaded or run. The agent refuses the attempt, for the dispatcher to run
// elsewhere, stops taking tasks until Health says otherwise, and does not count the
// load as the label's failure.
var ErrUnavailable = errors.New("backend unavailable")

// ErrNotLoaded is returned by Run when the task's label is not loaded (Triton lost the
// model, in a restart, and could not load it again). The agent then drops the label,
// as if evicted, and reports the task's label as failed to load.
var ErrNotLoaded = errors.New("label not loaded")

// ErrUnloading is wrapped by the error of an Unload that started the unload but did
// not see it end (Triton kept the model UNLOADING past the unload timeout): the label
// runs no more tasks and its room is on its way to being free, so the agent drops it,
// and the backend's next Load must wait until that room is free.
var ErrUnloading = errors.New("unload under way")
