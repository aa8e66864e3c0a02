package batch

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// goodCheckpoint is one a job writes after its first lines.
const goodCheckpoint = `{"job_id":"batch-0123456789ab","input_offset":240,"lines":3,"output_size":300,"rejected_size":90,"done":false,` +
	`"input_head":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","input_head_bytes":4000,` +
	`"output":"/data/out.jsonl","rejected":"/data/out.rejected.jsonl",` +
	`"task_shape":{"label_field":"label","task_type_field":"task_type","parameters_field":"parameters","id_field":"id","default_task_type":""}}` + "\n"

// A corrupt checkpoint is refused naming what is wrong with it, never resumed from.
func TestDecodeCheckpointRefusesCorrupt(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ from, to, err string }{
		{`"job_id":"batch-0123456789ab"`, `"job_id":""`, "job_id"},
		{`"job_id":"batch-0123456789ab"`, `"job_id":"batch 1"`, "job_id"},
		{`"job_id":"batch-0123456789ab"`, `"job_id":"` + strings.Repeat("b", 65) + `"`, "job_id"},
		{`"job_id":"batch-0123456789ab"`, `"job_id":"batch-\u00e9"`, "job_id"},
		{`"lines":3`, `"lines":-3`, "lines -3 is negative"},
		{`"input_offset":240`, `"input_offset":-1`, "input_offset -1 is negative"},
		{`"rejected_size":90`, `"rejected_size":-90`, "rejected_size"},
		{`"lines":3`, `"lines":241`, "lines 241 is more than input_offset 240"},
		{`"output_size":300`, `"output_size":2`, "more than output_size 2"},
		{`"lines":3`, `"lines":0`, "no lines, yet"},
		{`"lines":3`, `"lines":9223372036854775808`, "cannot unmarshal"},
		{`"lines":3`, `"lines":"3"`, "cannot unmarshal"},
		{`"input_head_bytes":4000`, `"input_head_bytes":-1`, "input_head_bytes"},
		{`"input_head_bytes":4000`, `"input_head_bytes":65537`, "input_head_bytes"},
		{`"input_head":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"`, `"input_head":"e3b0"`, "input_head"},
		{`"input_head":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"`, `"input_head":"E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855"`, "input_head"},
		{`"input_head":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",`, ``, "without an input_head"},
		{`"output":"/data/out.jsonl"`, `"output":"out.jsonl"`, "not an absolute path"},
		{`"output":"/data/out.jsonl",`, ``, "one without the others"},
		{`,"task_shape":{"label_field":"label","task_type_field":"task_type","parameters_field":"parameters","id_field":"id","default_task_type":""}`, ``, "one without the others"},
		{`"done":false`, `"dome":false`, "unknown field"},
		{"}\n", "}{}", "more after"},
		{"}\n", "", "unexpected EOF"},
	} {
		b := strings.Replace(goodCheckpoint, c.from, c.to, 1)
		if b == goodCheckpoint {
			t.Fatalf("%q is not in the checkpoint", c.from)
		}
		cp, err := decodeCheckpoint([]byte(b))
		if err == nil || !strings.Contains(err.Error(), c.err) || !reflect.DeepEqual(cp, checkpoint{}) {
			t.Errorf("%s → %s: %+v, %v; want an error saying %q", c.from, c.to, cp, err, c.err)
		}
	}
	for _, b := range []string{
		goodCheckpoint,
		`{"job_id":"batch-0123456789ab","input_offset":0,"lines":0,"output_size":0,"rejected_size":0,"done":false}`, // older, fresh
		`{"job_id":"batch-1","input_offset":9,"lines":1,"output_size":30,"rejected_size":0,"done":false,"input_head":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","input_head_bytes":0}`,
	} {
		if _, err := decodeCheckpoint([]byte(b)); err != nil {
			t.Errorf("%s: %v", b, err)
		}
	}
}

// A checkpoint whose numbers pass decodeCheckpoint but are not the files' (damaged,
// or edited) is refused before anything is cut back: resumed, it cut the output
// mid-line, or numbered lines (and named their tasks) after other lines.
func TestResumeRefusesACheckpointThatIsNotTheFiles(t *testing.T) {
	t.Parallel()
	f := newFakeDispatcher(t, nil)
	lines := taskLines(5)
	lines[2] = "not json"
	cfg := setup(t, f, lines)
	run(t, cfg)
	cpPath := cfg.Output + ".checkpoint"
	rejPath := cfg.Output + ".rejected.jsonl"
	good, err := os.ReadFile(cpPath)
	if err != nil {
		t.Fatal(err)
	}
	var cp checkpoint
	if err := json.Unmarshal(good, &cp); err != nil || cp.Lines != 5 || cp.RejectedSize == 0 {
		t.Fatalf("checkpoint %s: %v", good, err)
	}
	files := map[string]string{}
	for _, p := range []string{cfg.Input, cfg.Output, rejPath} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = string(b)
	}
	for _, c := range []struct {
		name   string
		change func(*checkpoint)
		err    string
	}{
		{"output mid-line", func(c *checkpoint) { c.OutputSize -= 3 }, "out.jsonl: the checkpoint says a line ends at byte"},
		{"rejected mid-line", func(c *checkpoint) { c.RejectedSize-- }, "rejected.jsonl: the checkpoint says a line ends at byte"},
		{"input mid-line", func(c *checkpoint) { c.InputOffset -= 2 }, "in.jsonl: the checkpoint says a line ends at byte"},
		{"a line short", func(c *checkpoint) { c.Lines-- }, "the checkpoint counts 4 lines, but the last it counts is line 5"},
		{"a line more", func(c *checkpoint) { c.Lines++ }, "the checkpoint counts 6 lines, but the last it counts is line 5"},
		{"job id", func(c *checkpoint) { c.JobID = "batch\n" }, "corrupt: job_id"},
	} {
		bad := cp
		c.change(&bad)
		b, err := json.Marshal(bad)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cpPath, b, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err = Run(context.Background(), cfg)
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v; want an error saying %q", c.name, err, c.err)
		}
		for p, want := range files {
			if got, _ := os.ReadFile(p); string(got) != want {
				t.Fatalf("%s: %s changed:\n%s", c.name, filepath.Base(p), got)
			}
		}
	}
	if err := os.WriteFile(cpPath, good, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, cfg) // the job's own checkpoint still resumes
	if got, _ := os.ReadFile(cfg.Output); string(got) != files[cfg.Output] {
		t.Fatalf("the output changed:\n%s", got)
	}
}

// FuzzDecodeCheckpoint: a checkpoint file is read back from disk, where anything may
// have happened to it. Whatever it holds, decodeCheckpoint refuses it with a message
// or returns a checkpoint whose fields could have been written together, which saves
// and reads back as itself.
func FuzzDecodeCheckpoint(f *testing.F) {
	f.Add([]byte(goodCheckpoint))
	f.Add([]byte(`{"job_id":"batch-0123456789ab","input_offset":0,"lines":0,"output_size":0,"rejected_size":0,"done":false}`))
	f.Add([]byte(`{"job_id":"b","input_offset":9,"lines":9,"output_size":9,"rejected_size":1,"done":true}`))
	f.Add([]byte(`{"job_id":"batch-1","lines":-1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		cp, err := decodeCheckpoint(b)
		if err != nil {
			if err.Error() == "" || !reflect.DeepEqual(cp, checkpoint{}) {
				t.Fatalf("%+v with error %q", cp, err)
			}
			return
		}
		if cp.JobID == "" || len(cp.JobID) > maxJobIDBytes || strings.ContainsFunc(cp.JobID, func(r rune) bool { return r <= ' ' || r > '~' }) {
			t.Fatalf("job id %q accepted", cp.JobID)
		}
		if cp.Lines < 0 || cp.Lines > cp.InputOffset || cp.Lines > cp.OutputSize || cp.RejectedSize < 0 ||
			cp.Lines == 0 && cp.InputOffset+cp.OutputSize+cp.RejectedSize != 0 {
			t.Fatalf("accepted %+v", cp)
		}
		if cp.InputHeadBytes < 0 || cp.InputHeadBytes > inputHeadBytes || cp.InputHead != "" && len(cp.InputHead) != 64 {
			t.Fatalf("accepted input head %q of %d bytes", cp.InputHead, cp.InputHeadBytes)
		}
		if cp.Output != "" && !filepath.IsAbs(cp.Output) || cp.Rejected != "" && !filepath.IsAbs(cp.Rejected) || (cp.Output == "") != (cp.Shape == nil) {
			t.Fatalf("accepted output %q, rejected %q, shape %v", cp.Output, cp.Rejected, cp.Shape)
		}
		saved, err := json.Marshal(cp)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeCheckpoint(append(saved, '\n'))
		if err != nil || !reflect.DeepEqual(again, cp) {
			t.Fatalf("%+v saved as %s reads back as %+v, %v", cp, saved, again, err)
		}
	})
}
