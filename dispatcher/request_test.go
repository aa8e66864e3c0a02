package dispatcher

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseRunTaskParameters(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		`{"task_type":"x","label":"m","parameters_json":"{\"data\": \"sample\"}"}`: `{"data": "sample"}`,
		`{"task_type":"x","label":"m","parameters_json":{"a":[1,2]}}`:              `{"a":[1,2]}`,
		`{"task_type":"x","label":"m","parameters_json":null}`:                     ``,
		`{"task_type":"x","label":"m"}`:                                            ``,
	}
	for body, want := range cases {
		spec, err := parseRunTask([]byte(body))
		if err != nil || string(spec.params) != want || !spec.returnResult {
			t.Errorf("%s: params %q err %v, want %q", body, spec.params, err, want)
		}
	}
	spec, err := parseRunTask([]byte(`{"task_type":"x","label":"m","return_result":false,"timeout_ms":1500}`))
	if err != nil || spec.returnResult || spec.timeout.Milliseconds() != 1500 {
		t.Fatalf("options: %+v %v", spec, err)
	}
}

// Keys are the documented ones, spelt exactly, each once. encoding/json matches field
// names in any case and lets a repeated key win: "LABEL" was taken for label, and a
// proxy that checked the first "label" saw another task than the one run.
func TestParseRunTaskKeysExactlyOnce(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"Task_Type":"x","LABEL":"m","Return_Result":false}`:           `unknown field "Task_Type"`,
		`{"task_type":"x","label":"m","Timeout_MS":5}`:                  `unknown field "Timeout_MS"`,
		`{"task_type":"x","label":"a","label":"b"}`:                     `field "label" given twice`,
		`{"task_type":"x","label":"m","parameters_json":{"A":1,"A":2}}`: "",                            // inside parameters: the worker's business
		`{"task_type":"x","\u006cabel":"m"}`:                            "",                            // an escaped key is still its name
		`{"task_type":"x","label":"m","task_id":"t","task_id":"t"}`:     `field "task_id" given twice`, // even with one value
	} {
		_, err := parseRunTask([]byte(body))
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v, want it accepted", body, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want an error with %q", body, err, want)
		}
	}
}

// FuzzParseRunTask: no body may panic the parser, and an accepted body always yields
// a task the rest of the dispatcher can trust.
func FuzzParseRunTask(f *testing.F) {
	for _, s := range []string{
		`{"task_id":"t-1","task_type":"sample_task","label":"label-1","parameters_json":"{\"data\": \"sample\"}"}`,
		`{"task_type":"infer","label":"m","parameters_json":{"inputs":[]},"return_result":false,"timeout_ms":10}`,
		`{"label":""}`, `[]`, `null`, `{"task_type":"x","label":"m"} trailing`, `{"parameters_json":"\u0000"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		spec, err := parseRunTask(body)
		if err != nil {
			return
		}
		if checkName("label", spec.label, maxLabelLength, true) != nil ||
			checkName("task_type", spec.taskType, maxTypeLength, true) != nil ||
			checkName("task_id", spec.id, maxIDLength, false) != nil {
			t.Fatalf("accepted invalid names: %+v", spec)
		}
		if len(spec.params) > 0 && !json.Valid(spec.params) {
			t.Fatalf("accepted parameters that are not JSON: %q", spec.params)
		}
		if spec.timeout < 0 {
			t.Fatalf("negative timeout %v", spec.timeout)
		}
	})
}

// The parsed task keeps no reference into the body, which runTask reuses.
func TestParseRunTaskDoesNotAliasBody(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"task_id":"t1","task_type":"x","label":"m","parameters_json":{"a":1}}`,
		`{"task_id":"t1","task_type":"x","label":"m","parameters_json":"{\"a\":1}"}`,
	} {
		b := []byte(body)
		spec, err := parseRunTask(b)
		if err != nil {
			t.Fatal(err)
		}
		for i := range b {
			b[i] = 'X'
		}
		if spec.id != "t1" || spec.label != "m" || spec.taskType != "x" || string(spec.params) != `{"a":1}` {
			t.Fatalf("spec changed with the body: %+v params %q", spec, spec.params)
		}
	}
}

// FuzzScanRunTask holds the one-pass scanner to encoding/json: every body it accepts,
// decodeRunTask accepts too, with the same fields.
func FuzzScanRunTask(f *testing.F) {
	for _, s := range []string{
		`{"task_id":"t-1","task_type":"sample_task","label":"label-1","parameters_json":"{\"data\": \"sample\"}"}`,
		`{"task_type":"x","label":"m","return_result":false,"timeout_ms":1500}`,
		` { "label" : "m" , "task_type":"x", "parameters_json":"" } `,
		`{"label":"m","timeout_ms":-0}`, `{"label":"m","timeout_ms":012}`, `{"label":"m","timeout_ms":1e3}`,
		`{"label":"m","label":"n"}`, `{"Label":"m"}`, `{"label":"a\/b"}`, `{"parameters_json":"[1,\"\\t\"]"}`,
		`{}`, `{"label":"m",}`, `{"label":"m"}x`, `{"parameters_json":"{\"a\":\u0031}"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fast, ok := scanRunTask(body)
		if !ok {
			return
		}
		slow, err := decodeRunTask(body)
		if err != nil {
			t.Fatalf("scanner accepted what encoding/json refuses (%v): %q", err, body)
		}
		same := fast.id == slow.id && fast.taskType == slow.taskType && fast.label == slow.label &&
			string(fast.params) == string(slow.params) &&
			(fast.returnResult == nil) == (slow.returnResult == nil) && (fast.timeoutMS == nil) == (slow.timeoutMS == nil) &&
			(fast.returnResult == nil || *fast.returnResult == *slow.returnResult) &&
			(fast.timeoutMS == nil || *fast.timeoutMS == *slow.timeoutMS)
		if !same {
			t.Fatalf("%q: scanner %+v, encoding/json %+v", body, fast, slow)
		}
	})
}

// The scanner takes the seed's body, so the hot path does not fall back.
func TestScanRunTaskTakesTheSeedsBody(t *testing.T) {
	t.Parallel()
	f, ok := scanRunTask([]byte(`{"task_id":"wrk-1-2","task_type":"sample_task","label":"label-3","parameters_json":"{\"data\": \"sample\"}","return_result":true,"timeout_ms":60000}`))
	if !ok || f.id != "wrk-1-2" || f.label != "label-3" || string(f.params) != `{"data": "sample"}` || !*f.returnResult || *f.timeoutMS != 60000 {
		t.Fatalf("scan: %+v ok=%v", f, ok)
	}
}

// BenchmarkParseRunTask is the per-request cost of decoding and validating the seed's body.
func BenchmarkParseRunTask(b *testing.B) {
	body := []byte(`{"task_id":"wrk-1-12345","task_type":"sample_task","label":"label-3","parameters_json":"{\"data\": \"sample\"}"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseRunTask(body); err != nil {
			b.Fatal(err)
		}
	}
}
