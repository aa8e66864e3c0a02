package triton

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/smartroute/smartroute/proto/frame"
)

// Triton's repository index is input from another process (or a proxy in front of
// it): whatever it holds, decodeIndex refuses it or returns the array's entries, and
// what the worker announces of it (indexNames, indexLoaded) is each label named by
// the index, once, in index order, every one of them a label the dispatcher takes.
func FuzzDecodeIndex(f *testing.F) {
	for _, s := range []string{
		`[]`, `null`, `[{"name":"a"},{"name":"b","version":"1","state":"READY","reason":""},{"name":"b","version":"2","state":"UNLOADING"}]`,
		`[{"name":""},{"name":"` + strings.Repeat("m", 257) + `","state":"READY"}]`, `[null,{"name":"\u00e9","state":"READY"}]`,
		`[{"name":"m","version":1}]`, `{"models":[]}`, `[{"name":"\xff","state":"READY"}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		entries, err := decodeIndex(body)
		if err != nil {
			if entries != nil || err.Error() == "" {
				t.Fatalf("%v with error %q", entries, err)
			}
			return
		}
		if entries == nil {
			t.Fatal("no error and no entries")
		}
		check := func(what string, got []string, pick func(indexEntry) bool) {
			var want []string
			seen := map[string]bool{}
			for _, e := range entries {
				if pick(e) && frame.CheckLabel("l", e.Name) == nil && !seen[e.Name] {
					seen[e.Name] = true
					want = append(want, e.Name)
				}
			}
			if strings.Join(got, "\x00") != strings.Join(want, "\x00") || len(got) != len(want) {
				t.Fatalf("%s = %q, want %q", what, got, want)
			}
			if err := frame.CheckLabels(what, got); err != nil {
				t.Fatal(err)
			}
			for _, l := range got {
				if !utf8.ValidString(l) {
					t.Fatalf("%s lists %q, not UTF-8", what, l)
				}
			}
		}
		check("indexNames", indexNames(entries), func(indexEntry) bool { return true })
		check("indexLoaded", indexLoaded(entries), func(e indexEntry) bool { return e.State == "READY" })
		for _, e := range entries {
			s := heldState(entries, e.Name)
			if s == "" {
				continue
			}
			found := false
			for _, o := range entries {
				found = found || o.Name == e.Name && o.State == s
			}
			if !found || s == "UNAVAILABLE" {
				t.Fatalf("heldState(%q) = %q", e.Name, s)
			}
		}
	})
}

// Triton's error answer may be anything (a proxy's page, any encoding, any status):
// its message is never empty, and always UTF-8.
func FuzzErrorMessage(f *testing.F) {
	for _, s := range []string{`{"error":"load failed"}`, ``, " \n", "caf\xe9", "{\"error\":\"\xff\"}", `{"error":""}`, `{"error":5}`} {
		f.Add(400, []byte(s))
		f.Add(599, []byte(s))
	}
	f.Fuzz(func(t *testing.T, code int, raw []byte) {
		m := errorMessage(code, raw)
		if m == "" || !utf8.ValidString(m) {
			t.Fatalf("errorMessage(%d, %q) = %q", code, raw, m)
		}
	})
}

// A producer's parameters_json goes to Triton as it is. Whatever it holds,
// checkInferRequest refuses it or it is an infer request with inputs, asking for no
// binary output and replayable only when it is no sequence, both as Triton reads
// repeated keys (the first) and as encoding/json does (the last).
func FuzzCheckInferRequest(f *testing.F) {
	for _, s := range []string{
		`{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],"outputs":[{"name":"y"}]}`,
		`{"inputs":[{}],"parameters":{"sequence_id":1},"parameters":{}}`,
		`{"inputs":[{}],"parameters":{"binary_data_output":true,"binary_data_output":false}}`,
		`{"inputs":[{}],"outputs":[{"parameters":{"binary_data":false}},{"parameters":{"binary_data":true}}]}`,
		`{"inputs":[{}],"Parameters":{"sequence_id":1}}`, `{"inputs":[]}`, `null`, `{"inputs":[1]} x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, params []byte) {
		replayable, err := checkInferRequest(params)
		if err != nil {
			if replayable || err.Error() == "" {
				t.Fatalf("replayable %v with error %q", replayable, err)
			}
			return
		}
		var last any
		if err := json.Unmarshal(params, &last); err != nil {
			t.Fatalf("accepted %q, which is not JSON: %v", params, err)
		}
		first, err := firstWins(json.NewDecoder(strings.NewReader(string(params))))
		if err != nil {
			t.Fatal(err)
		}
		for view, req := range map[string]any{"first": first, "last": last} {
			r, ok := req.(map[string]any)
			if !ok {
				t.Fatalf("%s: accepted %q, not an object", view, params)
			}
			if in, ok := r["inputs"].([]any); !ok || len(in) == 0 {
				t.Fatalf("%s: accepted %q without inputs", view, params)
			}
			top, ok := r["parameters"].(map[string]any)
			if !ok && r["parameters"] != nil {
				t.Fatalf("%s: accepted parameters %v", view, r["parameters"])
			}
			_, sequence := top["sequence_id"]
			if top["binary_data_output"] == true || replayable == sequence {
				t.Fatalf("%s: accepted %q as replayable %v", view, params, replayable)
			}
			outs, ok := r["outputs"].([]any)
			if !ok && r["outputs"] != nil {
				t.Fatalf("%s: accepted outputs %v", view, r["outputs"])
			}
			for _, o := range outs {
				om, ok := o.(map[string]any)
				p, pok := om["parameters"].(map[string]any)
				if !ok || !pok && om["parameters"] != nil || p["binary_data"] == true {
					t.Fatalf("%s: accepted output %v", view, o)
				}
			}
		}
	})
}

// firstWins decodes one JSON value as Triton's parser reads it: of a repeated key in an
// object, the first.
func firstWins(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		m := map[string]any{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := firstWins(dec)
			if err != nil {
				return nil, err
			}
			if _, ok := m[k.(string)]; !ok {
				m[k.(string)] = v
			}
		}
		_, err := dec.Token()
		return m, err
	case json.Delim('['):
		a := []any{}
		for dec.More() {
			v, err := firstWins(dec)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := dec.Token()
		return a, err
	}
	return tok, nil
}
