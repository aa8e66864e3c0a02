package dispatcher

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzValidJSON holds validJSON to json.Valid, the definition it stands in for.
func FuzzValidJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `[1,2]`, `"a"`, `-0.1e5`, `01`, `1.`, `1e+`, `-`, `.5`, `{"a":[true,false,null]}`,
		" 1 ", "\"\\u00e9\"", "\"\\u00g9\"", "\"\xff\"", "\"\t\"", `[`, `{"a" 1}`, `{"a":1,}`, `[1,]`,
		`{"task_id":"t","parameters_json":"{\"data\": \"sample\"}"}`, `nul`, `truex`, "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid = %v", b, got, want)
		}
	})
}

// At and past encoding/json's nesting limit, where gjson's validator differs from it
// and recurses once per level.
func TestValidJSONNesting(t *testing.T) {
	for _, depth := range []int{maxJSONNesting - 1, maxJSONNesting, maxJSONNesting + 1, 1 << 20} {
		for _, open := range []string{"[", `{"a":`} {
			closer := map[string]string{"[": "]", `{"a":`: "}"}[open]
			b := []byte(strings.Repeat(open, depth) + "1" + strings.Repeat(closer, depth))
			if got, want := validJSON(b), json.Valid(b); got != want {
				t.Errorf("%d levels of %s: validJSON %v, json.Valid %v", depth, open, got, want)
			}
		}
	}
	// Many brackets, little depth: still valid either way.
	wide := []byte("[" + strings.TrimSuffix(strings.Repeat("[],", maxJSONNesting), ",") + "]")
	if !validJSON(wide) {
		t.Error("a wide, shallow array is valid JSON")
	}
}

// The result is kept after the frame it came in is reused for the next one.
func TestResultJSONCopies(t *testing.T) {
	frame := []byte(`{"a":1}`)
	got := resultJSON(frame)
	copy(frame, `{"b":2}`)
	if !bytes.Equal(got, []byte(`{"a":1}`)) {
		t.Errorf("resultJSON aliases its input: %s", got)
	}
	if s := resultJSON([]byte("plain text")); string(s) != `"plain text"` {
		t.Errorf("a result that is not JSON is embedded as a string, got %s", s)
	}
}

func BenchmarkValidJSON(b *testing.B) {
	res := []byte(`{"task_id":"wrk-1-12345","task_type":"sample_task","label":"label-3","worker_id":"tp-1","parameters_json":"{\"data\": \"sample\"}"}`)
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			json.Valid(res)
		}
	})
	b.Run("validJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			validJSON(res)
		}
	})
}
