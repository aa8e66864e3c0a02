package batch

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// checkpoint is the durable progress of a job. Everything it counts is on disk: the
// output and rejected files are fsynced before it is written, and it is replaced
// atomically, so after any crash the files hold at least what it records. Resuming
// cuts them back to these sizes and seeks the input; nothing is rescanned.
type checkpoint struct {
	// JobID prefixes the task ids, so a resumed job's resubmissions attach to runs the
	// dispatcher still has in flight or answered recently.
	JobID string `json:"job_id"`
	// InputOffset is where the next unwritten line starts in the input.
	InputOffset int64 `json:"input_offset"`
	// Lines is how many input lines are written (to output, and to rejected when so).
	Lines int64 `json:"lines"`
	// OutputSize and RejectedSize are the files' sizes after those lines.
	OutputSize   int64 `json:"output_size"`
	RejectedSize int64 `json:"rejected_size"`
	// Done is set once every line of the input is written.
	Done bool `json:"done"`
	// InputHead is the sha256 (hex) of the input's first InputHeadBytes bytes when the
	// job started: a resume on another file (the same command on a new input) is
	// refused instead of seeking it to this job's offset. Empty in older checkpoints.
	InputHead      string `json:"input_head,omitempty"`
	InputHeadBytes int64  `json:"input_head_bytes,omitempty"`
	// Output and Rejected are the files' absolute paths: a resume that names another
	// file would cut that one back to the sizes above. Shape is what turns a line into
	// a task: a resume that reads lines otherwise would send other tasks under the ids
	// the first run used, which the dispatcher answers with those runs' results. All
	// empty in older checkpoints, which are resumed unchecked.
	Output   string     `json:"output,omitempty"`
	Rejected string     `json:"rejected,omitempty"`
	Shape    *taskShape `json:"task_shape,omitempty"`
}

// taskShape is the configuration that makes tasks of input lines.
type taskShape struct {
	LabelField      string `json:"label_field"`
	TaskTypeField   string `json:"task_type_field"`
	ParametersField string `json:"parameters_field"`
	IDField         string `json:"id_field"`
	DefaultTaskType string `json:"default_task_type"`
}

func shapeOf(c Config) *taskShape {
	return &taskShape{c.Fields.Label, c.Fields.TaskType, c.Fields.Parameters, c.Fields.ID, c.DefaultTaskType}
}

// differs names the settings of s that other does not share, as flags.
func (s *taskShape) differs(other *taskShape) []string {
	var out []string
	for _, f := range []struct {
		flag string
		a, b string
	}{
		{"--label-field", s.LabelField, other.LabelField}, {"--task-type-field", s.TaskTypeField, other.TaskTypeField},
		{"--parameters-field", s.ParametersField, other.ParametersField}, {"--id-field", s.IDField, other.IDField},
		{"--default-task-type", s.DefaultTaskType, other.DefaultTaskType},
	} {
		if f.a != f.b {
			out = append(out, fmt.Sprintf("%s %q (was %q)", f.flag, f.b, f.a))
		}
	}
	return out
}

// samePath says whether the path given now may be the file the checkpoint recorded:
// the same absolute path; the same file by another name; or the recorded path gone
// (the job's directory moved, or its volume mounted elsewhere). Refused only when the
// recorded file is still there and the given one is another.
func samePath(recorded, given string) bool {
	abs, err := filepath.Abs(given)
	if err == nil && abs == recorded {
		return true
	}
	a, errA := os.Stat(recorded)
	if errors.Is(errA, fs.ErrNotExist) {
		return true
	}
	b, errB := os.Stat(given)
	return errA == nil && errB == nil && os.SameFile(a, b)
}

// inputHeadBytes is how much of the input its fingerprint covers: enough to tell two
// files apart, little enough to read at every start.
const inputHeadBytes = 64 << 10

// inputHead is the sha256 (hex) of f's first n bytes; f's offset is left at n.
func inputHead(f *os.File, n int64) (string, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.CopyN(h, f, n); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// newJobID is a random id for a fresh job.
func newJobID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return "batch-" + hex.EncodeToString(b)
}

// loadCheckpoint reads path; ok is false when there is none.
func loadCheckpoint(path string) (cp checkpoint, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return checkpoint{}, false, nil
	}
	if err != nil {
		return checkpoint{}, false, fmt.Errorf("reading checkpoint: %w", err)
	}
	if cp, err = decodeCheckpoint(b); err != nil {
		return checkpoint{}, false, fmt.Errorf("checkpoint %s is corrupt: %w; to start over, remove it and the job's output and rejected files", path, err)
	}
	return cp, true, nil
}

// maxJobIDBytes bounds a checkpoint's job id: task ids are "<job id>-<line>-r<n>", and
// the dispatcher takes ids of at most 256 bytes. A fresh job's is 18.
const maxJobIDBytes = 64

// decodeCheckpoint reads a checkpoint as save writes it, and refuses one whose fields
// could not have been written together: resuming from it would cut the files back to
// sizes, or send lines under task ids, that are not the job's. Unknown fields are
// refused too: a checkpoint this version cannot read whole is not resumed in part.
func decodeCheckpoint(b []byte) (checkpoint, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var cp checkpoint
	if err := dec.Decode(&cp); err != nil {
		return checkpoint{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return checkpoint{}, errors.New("more after the checkpoint's object")
	}
	if err := cp.check(); err != nil {
		return checkpoint{}, err
	}
	return cp, nil
}

// check says which field of cp is not one a job writes.
func (cp checkpoint) check() error {
	if cp.JobID == "" || len(cp.JobID) > maxJobIDBytes {
		return fmt.Errorf("job_id %.80q is not 1 to %d bytes", cp.JobID, maxJobIDBytes)
	}
	for i := 0; i < len(cp.JobID); i++ {
		if c := cp.JobID[i]; c <= ' ' || c > '~' { // the dispatcher's rule for task ids
			return fmt.Errorf("job_id %q holds byte 0x%02x: task ids are printable ASCII without spaces", cp.JobID, c)
		}
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"input_offset", cp.InputOffset}, {"lines", cp.Lines}, {"output_size", cp.OutputSize}, {"rejected_size", cp.RejectedSize}} {
		if f.v < 0 {
			return fmt.Errorf("%s %d is negative", f.name, f.v)
		}
	}
	// Every line is at least one byte of the input (its newline, or the last line's
	// text) and of the output (its newline); no line written, no byte of any file.
	switch {
	case cp.Lines > cp.InputOffset:
		return fmt.Errorf("lines %d is more than input_offset %d bytes could hold", cp.Lines, cp.InputOffset)
	case cp.Lines > cp.OutputSize:
		return fmt.Errorf("lines %d is more than output_size %d bytes could hold", cp.Lines, cp.OutputSize)
	case cp.Lines == 0 && (cp.InputOffset != 0 || cp.OutputSize != 0 || cp.RejectedSize != 0):
		return fmt.Errorf("no lines, yet input_offset %d, output_size %d and rejected_size %d", cp.InputOffset, cp.OutputSize, cp.RejectedSize)
	}
	if cp.InputHeadBytes < 0 || cp.InputHeadBytes > inputHeadBytes {
		return fmt.Errorf("input_head_bytes %d is not 0 to %d", cp.InputHeadBytes, inputHeadBytes)
	}
	if cp.InputHead == "" && cp.InputHeadBytes != 0 {
		return fmt.Errorf("input_head_bytes %d without an input_head", cp.InputHeadBytes)
	}
	if cp.InputHead != "" {
		if h, err := hex.DecodeString(cp.InputHead); err != nil || len(h) != sha256.Size || hex.EncodeToString(h) != cp.InputHead {
			return fmt.Errorf("input_head %.80q is not a sha256 in lowercase hex", cp.InputHead)
		}
	}
	// All three absent in older checkpoints, all written together since.
	if (cp.Output == "") != (cp.Rejected == "") || (cp.Output == "") != (cp.Shape == nil) {
		return fmt.Errorf("output %.200q, rejected %.200q and task_shape: one without the others", cp.Output, cp.Rejected)
	}
	for _, f := range []struct{ name, path string }{{"output", cp.Output}, {"rejected", cp.Rejected}} { // as filepath.Abs wrote them
		if f.path != "" && (!filepath.IsAbs(f.path) || strings.IndexByte(f.path, 0) >= 0) {
			return fmt.Errorf("%s %.200q is not an absolute path", f.name, f.path)
		}
	}
	return nil
}

// save replaces path with cp atomically: a temporary file, fsynced, renamed over it,
// then the directory fsynced (with syncDir) so the rename itself survives a power cut.
func (cp checkpoint) save(path string, syncDir func(dir string) error) error {
	b, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("writing checkpoint: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		return fmt.Errorf("writing checkpoint: %w", err)
	}
	return nil
}

// syncDir fsyncs a directory: a file's own fsync does not make its name durable, the
// directory's does.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
