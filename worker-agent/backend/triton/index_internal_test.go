package triton

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/smartroute/smartroute/proto/frame"
	"github.com/smartroute/smartroute/worker-agent/backend"
)

// An unload is over only when no version of the model holds memory: the index lists
// each version on its own row, in any order.
func TestHeldStateLooksAtEveryVersion(t *testing.T) {
	t.Parallel()
	row := func(name, version, state string) indexEntry {
		return indexEntry{Name: name, Version: version, State: state}
	}
	for _, c := range []struct {
		entries []indexEntry
		want    string
	}{
		{nil, ""},
		{[]indexEntry{{Name: "m"}}, ""},
		{[]indexEntry{row("m", "1", "UNAVAILABLE")}, ""},
		{[]indexEntry{row("m", "1", "UNLOADING"), row("m", "2", "UNAVAILABLE")}, "UNLOADING"},
		{[]indexEntry{row("m", "1", "UNAVAILABLE"), row("m", "2", "READY")}, "READY"},
		{[]indexEntry{row("m", "1", "READY"), row("m", "2", "UNLOADING"), row("m", "3", "UNAVAILABLE")}, "UNLOADING"},
		{[]indexEntry{row("other", "1", "UNLOADING"), row("m", "1", "UNAVAILABLE")}, ""},
	} {
		if got := heldState(c.entries, "m"); got != c.want {
			t.Errorf("heldState(%v) = %q, want %q", c.entries, got, c.want)
		}
	}
}

// The index is a JSON array; null is not one, and read as an empty index it told an
// unload waiting for its model to leave UNLOADING that nothing held memory.
func TestDecodeIndexRefusesWhatIsNoArray(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`null`, ` null `, `{}`, `{"models":[]}`, `"[]"`, ``, `[{"name":"m","version":1}]`, `[] []`} {
		if entries, err := decodeIndex([]byte(body)); err == nil || entries != nil || !strings.Contains(err.Error(), "not a JSON array of models") {
			t.Errorf("%q: %v, %v; want an error", body, entries, err)
		}
	}
	for body, want := range map[string]int{`[]`: 0, ` [ ] `: 0, `[null,{"name":"m"}]`: 2, `[{"name":"m","version":"1","state":"READY","reason":"","extra":1}]`: 1} {
		if entries, err := decodeIndex([]byte(body)); err != nil || entries == nil || len(entries) != want {
			t.Errorf("%q: %v, %v; want %d entries", body, entries, err, want)
		}
	}
	// An unload waits on the index: null is a failed read, not "no version holds memory".
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/repository/index" {
			_, _ = w.Write([]byte("null"))
		}
	}))
	defer srv.Close()
	b, err := New(Config{URL: srv.URL, PollInterval: time.Millisecond, UnloadTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.CloseIdleConnections()
	if err := b.Unload(t.Context(), "m"); !errors.Is(err, backend.ErrUnloading) {
		t.Errorf("Unload with a null index = %v, want backend.ErrUnloading", err)
	}
	if _, err := b.Inventory(t.Context()); err == nil {
		t.Error("Inventory of a null index succeeded")
	}
}

// A model whose name no task can name (empty, or over frame.MaxLabelBytes) is left out
// of what the worker announces: the dispatcher refuses a hello or an Inventory that
// lists one, and the worker never connected. Each name is listed once.
func TestIndexNamesLeaveOutWhatIsNoLabel(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("m", frame.MaxLabelBytes+1)
	longest := strings.Repeat("m", frame.MaxLabelBytes)
	entries := []indexEntry{
		{Name: long, State: "READY"}, {Name: "b", Version: "1", State: "UNAVAILABLE"}, {Name: ""}, {Name: "a", Version: "1", State: "READY"},
		{Name: "b", Version: "2", State: "READY"}, {Name: "a", Version: "2", State: "READY"}, {Name: longest, State: "READY"},
	}
	if got := indexNames(entries); !slices.Equal(got, []string{"b", "a", longest}) {
		t.Errorf("indexNames = %q, want b, a and the longest label", got)
	}
	if got := indexLoaded(entries); !slices.Equal(got, []string{"a", "b", longest}) {
		t.Errorf("indexLoaded = %q, want a, b and the longest label", got)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(entries)
	}))
	defer srv.Close()
	b, err := New(Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer b.CloseIdleConnections()
	inv, err := b.Inventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if frame.CheckLabels("loadable", inv.Loadable) != nil || frame.CheckLabels("loaded", inv.Loaded) != nil || len(inv.Loadable) != 3 || len(inv.Loaded) != 3 {
		t.Errorf("inventory %q, %q: want three labels each, all of them labels", inv.Loadable, inv.Loaded)
	}
}

// A repository of many models is read every InventoryInterval: every name is listed
// once. How long it takes is BenchmarkIndexNames's to say (searching the list for each
// name took 5 s for 60,000 models): a wall-clock bound here failed on a busy host.
func TestIndexNamesOfALargeRepository(t *testing.T) {
	t.Parallel()
	entries := largeRepository(60_000)
	names, loaded := indexNames(entries), indexLoaded(entries)
	if len(names) != len(entries) || len(loaded) != len(entries) || names[0] != "model-000000" || names[len(names)-1] != "model-059999" {
		t.Fatalf("%d names and %d loaded of %d models (first %q); want each once, in order", len(names), len(loaded), len(entries), names[0])
	}
}

// go test -run '^$' -bench BenchmarkIndexNames ./backend/triton/ (in worker-agent/): a
// quadratic listing shows as seconds per operation, a linear one as milliseconds.
func BenchmarkIndexNames(b *testing.B) {
	entries := largeRepository(60_000)
	b.ReportAllocs()
	for b.Loop() {
		indexNames(entries)
		indexLoaded(entries)
	}
}

func largeRepository(n int) []indexEntry {
	entries := make([]indexEntry, n)
	for i := range entries {
		entries[i] = indexEntry{Name: fmt.Sprintf("model-%06d", i), State: "READY"}
	}
	return entries
}

// Triton's error answer: its message, else the body's text, else the status text, and
// never empty nor other than UTF-8 (a proxy's page may be in any encoding).
func TestErrorMessage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code       int
		body, want string
	}{
		{400, `{"error":"load failed"}`, "load failed"},
		{400, ` bad gateway `, "bad gateway"},
		{400, ``, "Bad Request"},
		{599, ``, "no message"},
		{599, `{"error":""}`, `{"error":""}`},
		{502, "caf\xe9", "caf\uFFFD"},
		{500, "{\"error\":\"\xff\"}", "\uFFFD"},
	} {
		if got := errorMessage(c.code, []byte(c.body)); got != c.want {
			t.Errorf("errorMessage(%d, %q) = %q, want %q", c.code, c.body, got, c.want)
		}
	}
}

// A producer's infer request is read as Triton reads it: a key given twice in an
// object this check reads is refused, since Triton would read the first and
// encoding/json the last. A sequence given so went out replayable (sent twice, it
// advanced the sequence twice), and a binary output asked for so was sent.
func TestCheckInferRequest(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ params, err string }{
		{`{"inputs":[{}],"parameters":{"sequence_id":1},"parameters":{}}`, `key "parameters" is given twice`},
		{`{"inputs":[{}],"parameters":{"binary_data_output":true,"binary_data_output":false}}`, `key "binary_data_output" is given twice`},
		{`{"inputs":[{}],"outputs":[{"name":"o","parameters":{"binary_data":true},"parameters":{}}]}`, `outputs[0]: key "parameters" is given twice`},
		{`{"inputs":[{}],"parameters":{"binary_data_output":true}}`, "binary_data outputs are not supported"},
		{`{"inputs":[{}],"outputs":[{},{"parameters":{"binary_data":true}}]}`, "binary_data outputs are not supported"},
		{`{"inputs":[]}`, "no inputs"},
		{`{"Inputs":[{}]}`, "no inputs"},
		{`{"inputs":{}}`, "no inputs"},
		{`null`, "it is empty or null"},
		{`[]`, "not a JSON object"},
		{`{"inputs":[{}]} {}`, "more after the object"},
		{`{"inputs":[{}],"outputs":{}}`, "outputs must be an array"},
		{`{"inputs":[{}],"outputs":[1]}`, "outputs[0]: not a JSON object"},
		{`{"inputs":[{}],"parameters":5}`, "parameters: not a JSON object"},
		{`{"inputs":[{}]`, "EOF"},
	} {
		if _, err := checkInferRequest([]byte(c.params)); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v; want an error saying %q", c.params, err, c.err)
		}
	}
	for params, replayable := range map[string]bool{
		`{"inputs":[{"name":"x"}]}`:                                                          true,
		` {"inputs":[1],"parameters":null,"outputs":null} `:                                  true,
		`{"inputs":[{}],"parameters":{"sequence_id":0}}`:                                     false,
		`{"inputs":[{}],"Parameters":{"sequence_id":1}}`:                                     true, // Triton reads keys exactly
		`{"inputs":[{}],"parameters":{"binary_data_output":false},"outputs":[{"name":"o"}]}`: true,
		`{"inputs":[{"parameters":{"a":1,"a":2}}]}`:                                          true, // not read here
	} {
		if got, err := checkInferRequest([]byte(params)); err != nil || got != replayable {
			t.Errorf("%s: replayable %v, %v; want %v", params, got, err, replayable)
		}
	}
}
