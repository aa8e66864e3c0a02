package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Fields names the JSON fields of an input line.
type Fields struct {
	Label      string // default "label"
	TaskType   string // default "task_type"
	Parameters string // default "parameters"
	ID         string // default "id"; copied to the output line when present
}

// lineTask is what one input line asks for.
type lineTask struct {
	label    string
	taskType string
	params   json.RawMessage // a JSON object or array, or a string holding JSON; nil when absent
	id       json.RawMessage // the line's id field as written, nil when absent
}

// parseLine reads one input line. defaultType is used when the line has no task type;
// empty means the field is required. Checks beyond the shape of the line (label
// characters and length, whether a parameters string holds JSON) are the dispatcher's:
// it answers 400 and the line is rejected with its message, so the rules live in one
// place. The result keeps no reference into line.
func parseLine(line []byte, f Fields, defaultType string) (lineTask, error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return lineTask{}, errors.New("empty line")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(line, &obj); err != nil {
		return lineTask{}, fmt.Errorf("not a JSON object: %v", err)
	}
	var t lineTask
	var err error
	if t.label, err = stringField(obj, f.Label, true); err != nil {
		return lineTask{}, err
	}
	if t.taskType, err = stringField(obj, f.TaskType, defaultType == ""); err != nil {
		return lineTask{}, err
	}
	if t.taskType == "" {
		t.taskType = defaultType
	}
	if raw, ok := obj[f.Parameters]; ok {
		raw = bytes.TrimSpace(raw)
		switch {
		case bytes.Equal(raw, []byte("null")):
		case raw[0] == '{' || raw[0] == '[' || raw[0] == '"':
			t.params = bytes.Clone(raw)
		default:
			return lineTask{}, fmt.Errorf("%s must be a JSON object, array or string", f.Parameters)
		}
	}
	if raw, ok := obj[f.ID]; ok {
		t.id = bytes.Clone(bytes.TrimSpace(raw))
	}
	return t, nil
}

// stringField returns obj[name] as a string: absent is an error when required, and a
// value of another JSON type always is.
func stringField(obj map[string]json.RawMessage, name string, required bool) (string, error) {
	raw, ok := obj[name]
	if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if required {
			return "", fmt.Errorf("missing %s", name)
		}
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s must be a string", name)
	}
	if s == "" && required {
		return "", fmt.Errorf("missing %s", name)
	}
	return s, nil
}

// lineReader reads lines and knows the byte offset after each, so a checkpoint can
// seek the input instead of rescanning it.
type lineReader struct {
	r       *bufio.Reader
	offset  int64 // input offset of the next unread byte
	maxLine int
	buf     []byte
}

func newLineReader(r io.Reader, offset int64, maxLine int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 64<<10), offset: offset, maxLine: maxLine}
}

// errLineTooLong is returned (with the line's length) for a line over the limit; the
// reader has skipped it, so reading goes on.
type errLineTooLong struct{ n, max int }

func (e *errLineTooLong) Error() string {
	return fmt.Sprintf("line is at least %d bytes long, the limit is %d", e.n, e.max)
}

// next returns the next line without its newline, valid until the following call,
// and the offset just after it. io.EOF means no more lines; a last line without a
// newline is still a line.
func (lr *lineReader) next() ([]byte, int64, error) {
	first := lr.offset == 0
	lr.buf = lr.buf[:0]
	tooLong := 0
	for {
		chunk, err := lr.r.ReadSlice('\n')
		lr.offset += int64(len(chunk))
		switch {
		case tooLong > 0: // skipping the rest of a long line
			tooLong += len(chunk)
		case len(lr.buf)+len(chunk) > lr.maxLine+2: // +2: room for "\r\n"; exact check below
			tooLong = len(lr.buf) + len(chunk)
			lr.buf = lr.buf[:0]
		default:
			lr.buf = append(lr.buf, chunk...)
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && len(lr.buf) == 0 && tooLong == 0:
			return nil, lr.offset, io.EOF
		case err != nil && err != io.EOF:
			return nil, lr.offset, err
		}
		if tooLong > 0 {
			return nil, lr.offset, &errLineTooLong{n: tooLong, max: lr.maxLine}
		}
		line := bytes.TrimSuffix(lr.buf, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		if first {
			// Editors that save "UTF-8 with BOM" begin the file with one; it is not the
			// line's JSON, and a parser may ignore it (RFC 8259 8.1).
			line = bytes.TrimPrefix(line, []byte("\ufeff"))
		}
		if len(line) > lr.maxLine { // the limit is on the line, whatever ends it
			return nil, lr.offset, &errLineTooLong{n: len(line), max: lr.maxLine}
		}
		return line, lr.offset, nil
	}
}
