package dispatcher

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
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

// runTaskFields is a body's fields after decoding, before validation: the one shape
// both decoders below produce.
type runTaskFields struct {
	id, taskType, label string
	params              []byte // decoded parameters; nil when absent or empty
	returnResult        *bool
	timeoutMS           *int64
}

// parseRunTask decodes and validates a /run-task body. It never panics on any input,
// and keeps no reference into body (the caller reuses it).
func parseRunTask(body []byte) (taskSpec, error) {
	f, ok := scanRunTask(body)
	if !ok {
		var err error
		if f, err = decodeRunTask(body); err != nil {
			return taskSpec{}, err
		}
	}
	return f.spec()
}

// decodeRunTask is the general decoder: encoding/json, strict about unknown fields and
// trailing data. Its errors are the ones producers see.
func decodeRunTask(body []byte) (runTaskFields, error) {
	var req runTaskRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return runTaskFields{}, badRequest("body is not a valid task: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return runTaskFields{}, badRequest("body has data after the task object")
	}
	if err := checkRunTaskKeys(body); err != nil {
		return runTaskFields{}, err
	}
	params, err := parameters(req.ParametersJSON)
	if err != nil {
		return runTaskFields{}, err
	}
	return runTaskFields{id: req.TaskID, taskType: req.TaskType, label: req.Label, params: params,
		returnResult: req.ReturnResult, timeoutMS: req.TimeoutMS}, nil
}

// runTaskKeys are the keys of a task body, spelt as documented.
var runTaskKeys = []string{"task_id", "task_type", "label", "parameters_json", "return_result", "timeout_ms"}

// checkRunTaskKeys refuses what encoding/json lets through in a body it decoded: a key
// spelt in another case (it matches field names case-insensitively) and a repeated key
// (the last one wins, so whatever checked the first saw another task). body is one
// valid JSON object: decodeRunTask has decoded it.
func checkRunTaskKeys(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil { // the opening brace
		return badRequest("body is not a valid task: %v", err)
	}
	var seen [6]bool
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return badRequest("body is not a valid task: %v", err)
		}
		key, _ := tok.(string)
		i := slices.Index(runTaskKeys, key)
		switch {
		case i < 0:
			return badRequest("body is not a valid task: json: unknown field %q", key)
		case seen[i]:
			return badRequest("body is not a valid task: field %q given twice", key)
		}
		seen[i] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return badRequest("body is not a valid task: %v", err)
		}
	}
	return nil
}

// spec validates the fields.
func (f runTaskFields) spec() (taskSpec, error) {
	spec := taskSpec{id: f.id, taskType: f.taskType, label: f.label, params: f.params, returnResult: true}
	if err := checkName("label", f.label, maxLabelLength, true); err != nil {
		return taskSpec{}, err
	}
	if err := checkName("task_type", f.taskType, maxTypeLength, true); err != nil {
		return taskSpec{}, err
	}
	if err := checkName("task_id", f.id, maxIDLength, false); err != nil {
		return taskSpec{}, err
	}
	if f.returnResult != nil {
		spec.returnResult = *f.returnResult
	}
	if f.timeoutMS != nil {
		if *f.timeoutMS <= 0 || *f.timeoutMS > int64(24*time.Hour/time.Millisecond) {
			return taskSpec{}, badRequest("timeout_ms must be between 1 and 86400000, got %d", *f.timeoutMS)
		}
		spec.timeout = time.Duration(*f.timeoutMS) * time.Millisecond
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
		if !validJSON([]byte(s)) {
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
