package dispatcher

import (
	"fmt"
	"net/http"
)

// checkParams applies MaxParamsBytes to a parsed task. The body limit alone is not
// enough: parameters are kept until the task finishes and are sent to the worker, so
// they get a bound of their own that an operator can set below the body's.
func (d *Dispatcher) checkParams(spec taskSpec) *submitError {
	if len(spec.params) > d.cfg.MaxParamsBytes {
		return &submitError{http.StatusRequestEntityTooLarge,
			fmt.Sprintf("parameters_json is %d bytes, the limit is %d", len(spec.params), d.cfg.MaxParamsBytes)}
	}
	return nil
}

// labelQueueFull applies MaxQueuedPerLabel. Caller holds h.mu.
func (h *hub) labelQueueFull(label string) *submitError {
	if n := h.sched.Queued(label); n >= h.cfg.MaxQueuedPerLabel {
		return &submitError{http.StatusTooManyRequests,
			fmt.Sprintf("queue full for label %s: %d tasks waiting", label, n)}
	}
	return nil
}
