package batch

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

var defaultFields = Config{}.WithDefaults().Fields

func TestParseLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, line, defaultType string
		want                    lineTask
		err                     string
	}{
		{name: "object parameters", line: `{"id":7,"label":"m1","task_type":"infer","parameters":{"x":1}}`,
			want: lineTask{label: "m1", taskType: "infer", params: json.RawMessage(`{"x":1}`), id: json.RawMessage(`7`)}},
		{name: "string parameters as the seed sends them", line: `{"label":"m1","task_type":"t","parameters":"{\"x\":1}"}`,
			want: lineTask{label: "m1", taskType: "t", params: json.RawMessage(`"{\"x\":1}"`)}},
		{name: "default task type", line: `{"label":"m1"}`, defaultType: "sample_task", want: lineTask{label: "m1", taskType: "sample_task"}},
		{name: "empty", line: "  ", err: "empty line"},
		{name: "not JSON", line: `label=m1`, err: "not a JSON object"},
		{name: "array", line: `[1,2]`, err: "not a JSON object"},
		{name: "missing label", line: `{"task_type":"t"}`, err: "missing label"},
		{name: "empty label", line: `{"label":"","task_type":"t"}`, err: "missing label"},
		{name: "label not a string", line: `{"label":3,"task_type":"t"}`, err: "label must be a string"},
		{name: "missing task type", line: `{"label":"m"}`, err: "missing task_type"},
		{name: "number parameters", line: `{"label":"m","task_type":"t","parameters":5}`, err: "parameters must be"},
		{name: "trailing data", line: `{"label":"m","task_type":"t"} x`, err: "not a JSON object"},
	}
	for _, tt := range tests {
		got, err := parseLine([]byte(tt.line), defaultFields, tt.defaultType)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: err %v, want one containing %q", tt.name, err, tt.err)
			}
			continue
		}
		if err != nil || got.label != tt.want.label || got.taskType != tt.want.taskType || !bytes.Equal(got.params, tt.want.params) || !bytes.Equal(got.id, tt.want.id) {
			t.Errorf("%s: got %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func TestLineReaderOffsetsAndLongLines(t *testing.T) {
	t.Parallel()
	in := "a\r\n" + strings.Repeat("x", 20) + "\nbb\n\nlast"
	lr := newLineReader(strings.NewReader(in), 100, 8)
	type got struct {
		line string
		end  int64
		long bool
	}
	var lines []got
	for {
		l, end, err := lr.next()
		if err == io.EOF {
			break
		}
		var tl *errLineTooLong
		if err != nil && !errors.As(err, &tl) {
			t.Fatal(err)
		}
		lines = append(lines, got{string(l), end, tl != nil})
	}
	want := []got{{"a", 103, false}, {"", 124, true}, {"bb", 127, false}, {"", 128, false}, {"last", 132, false}}
	if len(lines) != len(want) {
		t.Fatalf("got %+v, want %+v", lines, want)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d: got %+v, want %+v", i+1, lines[i], want[i])
		}
	}
}

// The limit is on the line itself, whatever ends it: "\r\n", "\n", or the end of the
// input.
func TestLineReaderLimitIgnoresTheLineEnd(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		long bool
	}{
		{"12345678\n", false}, {"12345678\r\n", false}, {"12345678", false},
		{"123456789\n", true}, {"123456789\r\n", true}, {"123456789", true}, {"1234567\r\r\n", false},
	} {
		l, end, err := newLineReader(strings.NewReader(c.in), 0, 8).next()
		var tl *errLineTooLong
		if long := errors.As(err, &tl); long != c.long || (err != nil && !long) || end != int64(len(c.in)) {
			t.Errorf("%q with an 8-byte limit: line %q, end %d, err %v; want too long: %v", c.in, l, end, err, c.long)
		}
	}
}

// FuzzParseLine feeds arbitrary input through the line reader and the parser: nothing
// panics, offsets account for every byte, and an accepted line has a label and a type.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{
		`{"id":1,"label":"m1","task_type":"infer","parameters":{"x":[1,2]}}` + "\n",
		`{"label":"m1","task_type":"t","parameters":"{\"x\":1}"}` + "\r\n" + `{"label":null}`,
		"not json\n\n[1]\n",
		`{"label":"` + strings.Repeat("a", 70) + `","task_type":"t"}`,
		"{\"label\":\"\xff\",\"task_type\":\"t\",\"id\":{\"a\":1}}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		lr := newLineReader(bytes.NewReader(data), 0, 64)
		var end int64
		for {
			line, e, err := lr.next()
			if err == io.EOF {
				break
			}
			var tl *errLineTooLong
			if err != nil && !errors.As(err, &tl) {
				t.Fatal(err)
			}
			if e <= end {
				t.Fatalf("offset went from %d to %d", end, e)
			}
			end = e
			if err != nil {
				continue
			}
			task, perr := parseLine(line, defaultFields, "")
			if perr == nil && (task.label == "" || task.taskType == "") {
				t.Fatalf("accepted %q without a label or type: %+v", line, task)
			}
			if perr == nil && task.params != nil && !json.Valid(task.params) {
				t.Fatalf("accepted %q with invalid parameters %q", line, task.params)
			}
		}
		if end != int64(len(data)) {
			t.Fatalf("lines end at %d of %d bytes", end, len(data))
		}
	})
}
