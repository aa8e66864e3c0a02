package dispatcher

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Limits on what a producer may send. They keep one request from holding much memory
// and keep ids and labels printable in logs and metrics.
const (
	maxIDLength    = 256
	maxLabelLength = 256
	maxTypeLength  = 128
)

// runTaskRequest is the body of POST /run-task, compatible with the seed's producers.
type runTaskRequest struct {
	TaskID   string `json:"task_id"`
	TaskType string `json:"task_type"`
	Label    string `json:"label"`
	// ParametersJSON is a JSON document in a string, as the seed sends it; a JSON
	// object or array is accepted as well and passed on as is.
	ParametersJSON json.RawMessage `json:"parameters_json"`
	ReturnResult   *bool           `json:"return_result"`
	TimeoutMS      *int64          `json:"timeout_ms"`
}

// taskSpec is a validated request.
type taskSpec struct {
	id           string
	taskType     string
	label        string
	params       []byte
	returnResult bool
	timeout      time.Duration // zero: the dispatcher's default
}

// errBadRequest marks errors that are the producer's fault (400).
var errBadRequest = errors.New("bad request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, args...))
}

// parseRunTask decodes and validates a /run-task body. It never panics on any input,
// and keeps no reference into body (the caller reuses it).
func parseRunTask(body []byte) (taskSpec, error) {
	var req runTaskRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return taskSpec{}, badRequest("body is not a valid task: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return taskSpec{}, badRequest("body has data after the task object")
	}
	spec := taskSpec{id: req.TaskID, taskType: req.TaskType, label: req.Label, returnResult: true}
	if err := checkName("label", req.Label, maxLabelLength, true); err != nil {
		return taskSpec{}, err
	}
	if err := checkName("task_type", req.TaskType, maxTypeLength, true); err != nil {
		return taskSpec{}, err
	}
	if err := checkName("task_id", req.TaskID, maxIDLength, false); err != nil {
		return taskSpec{}, err
	}
	params, err := parameters(req.ParametersJSON)
	if err != nil {
		return taskSpec{}, err
	}
	spec.params = params
	if req.ReturnResult != nil {
		spec.returnResult = *req.ReturnResult
	}
	if req.TimeoutMS != nil {
		if *req.TimeoutMS <= 0 || *req.TimeoutMS > int64(24*time.Hour/time.Millisecond) {
			return taskSpec{}, badRequest("timeout_ms must be between 1 and 86400000, got %d", *req.TimeoutMS)
		}
		spec.timeout = time.Duration(*req.TimeoutMS) * time.Millisecond
	}
	return spec, nil
}

// parameters returns the task's parameters as JSON bytes.
func parameters(raw json.RawMessage) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("parameters_json: %v", err)
		}
		if s == "" {
			return nil, nil
		}
		if !json.Valid([]byte(s)) {
			return nil, badRequest("parameters_json must hold a JSON document")
		}
		return []byte(s), nil
	case '{', '[':
		return bytes.Clone(raw), nil // raw points into the request body, which is reused
	}
	return nil, badRequest("parameters_json must be a JSON string, object or array")
}

// checkName validates an id, label or type: printable ASCII without spaces, bounded.
func checkName(field, v string, max int, required bool) error {
	if v == "" {
		if required {
			return badRequest("%s is required", field)
		}
		return nil
	}
	if len(v) > max {
		return badRequest("%s is %d bytes long, the limit is %d", field, len(v), max)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c > '~' {
			return badRequest("%s may hold only printable ASCII without spaces (byte %d is 0x%02x)", field, i, c)
		}
	}
	return nil
}
